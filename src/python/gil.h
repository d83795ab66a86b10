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
// call's entry, PythonScope, and each AcquireGil) and waits for the others to leave. Once the drain
// has started, a thread of Python's (a threading.Thread, daemon or not) that enters an op call or
// takes the GIL in an opforge frame (after a kernel, or to run Python code) waits, uncounted and
// without the GIL, for the finalization to begin, and then parks until the process ends. If it
// does not begin within a second, an atexit handler registered before opforge's import waits for
// that thread (joins it, or a lock it holds): it goes on, as before the drain (parking it forever
// hung the exit). Threads Python did not start (a framework's workers running a pyfunc kernel,
// whose runtime's shutdown may wait for them) are left alone. The counts are read and written with
// the GIL held.
struct ExitDrain {
  bool draining = false;
  PyThreadState* drainer = nullptr;  // the thread draining (it goes on: it finalizes)
  int active = 0;                    // threads' holds in opforge frames, over all threads
};
inline ExitDrain& exit_drain() noexcept {
  static ExitDrain d;
  return d;
}
inline thread_local int t_holds = 0;       // this thread's share of ExitDrain::active
inline thread_local int t_python = -1;     // whether Python's threading started this thread (-1: not asked)
inline thread_local bool t_waited = false;  // this thread waited once and the finalization did not begin

inline bool finalizing() noexcept {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// Whether threading started this thread (the GIL held; asked once per thread, only during a
// drain): not a foreign thread, which threading sees as a _DummyThread.
inline bool is_python_thread() noexcept {
  if (t_python >= 0) return t_python == 1;
  t_python = 0;
  try {  // (the finalization may begin meanwhile: the thread parks, as CPython's GIL take would end it)
    PyObject* threading = PyImport_ImportModule("threading");
    PyObject* current = threading ? PyObject_CallMethod(threading, "current_thread", nullptr) : nullptr;
    PyObject* dummy = threading ? PyObject_GetAttrString(threading, "_DummyThread") : nullptr;
    if (current && dummy) t_python = PyObject_IsInstance(current, dummy) == 0 ? 1 : 0;
    Py_XDECREF(dummy);
    Py_XDECREF(current);
    Py_XDECREF(threading);
    PyErr_Clear();
  } catch (abi::__forced_unwind&) {
    park();
  }
  return t_python == 1;
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

// At a boundary of opforge's frames (the GIL held), once a drain has started on another thread:
// waits for the finalization to begin and parks, or goes on after a second (see above).
inline void park_if_draining() noexcept {
  ExitDrain& d = exit_drain();
  if (!d.draining || t_waited || PyThreadState_Get() == d.drainer || !is_python_thread()) return;
  const int holds = t_holds;
  d.active -= holds;
  t_holds = 0;
  PyThreadState* state = PyEval_SaveThread();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (std::chrono::steady_clock::now() < deadline) {
    if (finalizing()) park();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  take_gil_or_park([state] {
    PyEval_RestoreThread(state);
    return 0;
  });
  t_waited = true;
  t_holds = holds;
  d.active += holds;
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
// call): counted for the drain, or held up when one has started.
class PythonScope {
 public:
  PythonScope() noexcept { hold(); }
  ~PythonScope() { unhold(); }
  PythonScope(const PythonScope&) = delete;
  PythonScope& operator=(const PythonScope&) = delete;
};

// The atexit hook (the GIL held): holds up new op calls on other threads and waits, the GIL released
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
  t_waited = false;
}

// py::gil_scoped_release: the GIL released for the guard's lifetime (around a kernel); taking it
// back after a drain started, the thread is held up.
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
// already, on any thread (PyGILState_Ensure); counted for the drain (held up if one has started).
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
