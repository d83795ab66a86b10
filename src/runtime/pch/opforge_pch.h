// Precompiled header of the extension: pybind11 and the runtime, which every generated op
// translation unit includes (compiling them once instead of once per op).

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "runtime/runtime.h"
