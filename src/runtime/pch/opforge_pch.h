// Precompiled header of libopforge: the runtime, which every generated op translation unit and
// kernel includes (parsed once instead of once per op). The Python face (python.cpp, module.cpp)
// includes pybind11 itself; generated code never does.

#include "aot/aot.h"
#include "runtime/binding.h"
#include "runtime/runtime.h"
