// The GIL guards of the Python face: pybind11's gil_scoped_release and gil_scoped_acquire, but safe
// at interpreter exit.
//
// A daemon thread still inside an op when the interpreter shuts down (a kernel running without
// the GIL, a tensor over a NumPy array freed off the GIL) takes the GIL back afterwards. CPython
// 3.11-3.13 end such a thread with pthread_exit, whose unwinding reaches the guard's destructor:
// noexcept, so the process calls std::terminate ("terminate called without an active exception",
// SIGABRT), where NumPy's ufuncs exit cleanly. These guards catch that unwind and park the thread
// instead, as CPython 3.14 does itself: it sleeps until the process ends, touching nothing.
#pragma once

#include <Python.h>
#include <cxxabi.h>

#include <chrono>
#include <thread>

namespace opforge::python {

// Sleeps until the process ends.
[[noreturn]] inline void park() noexcept {
  for (;;) std::this_thread::sleep_for(std::chrono::hours(24));
}

// Runs take, which takes the GIL. When the interpreter is shutting down, CPython ends any thread
// but the finalizing one that asks for the GIL, with a forced unwind (abi::__forced_unwind):
// caught here, the thread parks inside the handler (leaving it without rethrowing would abort).
// The finalizing thread itself (a __del__ at shutdown calling an op) takes the GIL as usual.
template <typename Take>
auto take_gil_or_park(Take take) noexcept {
  try {
    return take();
  } catch (abi::__forced_unwind&) {
    park();
  }
}

// py::gil_scoped_release: the GIL released for the guard's lifetime (around a kernel).
class ReleaseGil {
 public:
  ReleaseGil() noexcept : state_(PyEval_SaveThread()) {}
  ~ReleaseGil() {
    take_gil_or_park([this] {
      PyEval_RestoreThread(state_);
      return 0;
    });
  }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  PyThreadState* state_;
};

// py::gil_scoped_acquire: the GIL held for the guard's lifetime, whether or not this thread held it
// already, on any thread (PyGILState_Ensure).
class AcquireGil {
 public:
  AcquireGil() noexcept : state_(take_gil_or_park([] { return PyGILState_Ensure(); })) {}
  ~AcquireGil() { PyGILState_Release(state_); }
  AcquireGil(const AcquireGil&) = delete;
  AcquireGil& operator=(const AcquireGil&) = delete;

 private:
  PyGILState_STATE state_;
};

}  // namespace opforge::python
