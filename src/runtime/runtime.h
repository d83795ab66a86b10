// Everything generated op code and hand-written kernels use from the runtime.
#pragma once

#include "runtime/autograd.h"
#include "runtime/dtype.h"
#include "runtime/elementwise.h"
#include "runtime/errors.h"
#include "runtime/functional.h"
#include "runtime/registry.h"
#include "runtime/tensor.h"
