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

// ---- interpreter exit
//
// The same forced unwind meets a daemon thread that runs Python code inside an op call when the
// interpreter starts finalizing (a __dlpack__ or a number's __index__ read from the call's
// arguments, a pyfunc kernel, a NumPy subclass's __del__): it asks for the GIL in CPython's eval
// loop, and the unwind runs opforge's destructors (py::objects freed without the GIL) and
// catch (...) handlers on the way out: SIGSEGV or "exception not rethrown" (SIGABRT). And a
// daemon thread still in a kernel when the process exits meets its libraries' teardown (OpenBLAS
// frees its buffers under a running dgemm: SIGSEGV). So opforge drains its calls before
// finalization begins (drain_at_exit, an atexit hook): it counts the threads inside op calls (the
// call's entry, PythonScope, and each AcquireGil), and once the drain starts every other thread
// parks, uncounted, where it next enters an op call or takes the GIL in an opforge frame (after a
// kernel, or to run Python code). The counts are read and written with the GIL held.
struct ExitDrain {
  bool draining = false;
  PyThreadState* drainer = nullptr;  // the thread draining (it goes on: it finalizes)
  int active = 0;                    // threads' holds in opforge frames, over all threads
};
inline ExitDrain& exit_drain() noexcept {
  static ExitDrain d;
  return d;
}
inline thread_local int t_holds = 0;  // this thread's share of ExitDrain::active

// Parks this thread, its holds uncounted and the GIL (which it holds) released, if a drain has
// started on another thread: it must not run Python code in opforge's frames again.
inline void park_if_draining() noexcept {
  ExitDrain& d = exit_drain();
  if (d.draining && PyThreadState_Get() != d.drainer) {
    d.active -= t_holds;
    t_holds = 0;
    PyEval_SaveThread();
    park();
  }
}

inline void hold() noexcept {
  park_if_draining();
  ++t_holds;
  ++exit_drain().active;
}

inline void unhold() noexcept {
  --t_holds;
  --exit_drain().active;
}

// An entry from Python into opforge that may run Python code or a kernel before it returns (an op
// call): counted for the drain, or parked when one has started.
class PythonScope {
 public:
  PythonScope() noexcept { hold(); }
  ~PythonScope() { unhold(); }
  PythonScope(const PythonScope&) = delete;
  PythonScope& operator=(const PythonScope&) = delete;
};

// The atexit hook (the GIL held): stops new op calls on other threads and waits, the GIL released
// in between, until no other thread is inside one (at most `limit`: a call that does not end, a
// pyfunc waiting for the main thread, leaves the risk as it was).
inline void drain_at_exit(std::chrono::milliseconds limit) noexcept {
  ExitDrain& d = exit_drain();
  d.draining = true;
  d.drainer = PyThreadState_Get();
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (d.active > t_holds && std::chrono::steady_clock::now() < deadline) {
    PyThreadState* state = PyEval_SaveThread();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    PyEval_RestoreThread(state);
  }
}

// A forked child has only the forking thread: only its holds count.
inline void reset_drain_in_child() noexcept {
  ExitDrain& d = exit_drain();
  d.draining = false;
  d.drainer = nullptr;
  d.active = t_holds;
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

// py::gil_scoped_release: the GIL released for the guard's lifetime (around a kernel); taking it
// back after a drain started, the thread parks.
class ReleaseGil {
 public:
  ReleaseGil() noexcept : state_(PyEval_SaveThread()) {}
  ~ReleaseGil() {
    take_gil_or_park([this] {
      PyEval_RestoreThread(state_);
      return 0;
    });
    park_if_draining();
  }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  PyThreadState* state_;
};

// py::gil_scoped_acquire: the GIL held for the guard's lifetime, whether or not this thread held it
// already, on any thread (PyGILState_Ensure); counted for the drain (parked if one has started).
class AcquireGil {
 public:
  AcquireGil() noexcept : state_(take_gil_or_park([] { return PyGILState_Ensure(); })) { hold(); }
  ~AcquireGil() {
    unhold();
    PyGILState_Release(state_);
  }
  AcquireGil(const AcquireGil&) = delete;
  AcquireGil& operator=(const AcquireGil&) = delete;

 private:
  PyGILState_STATE state_;
};

}  // namespace opforge::python
