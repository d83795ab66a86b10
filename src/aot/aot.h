// AOT entry points: every op callable through MindSpore's AOT C ABI
//   extern "C" int f(int nparam, void** params, int* ndims, int64_t** shapes,
//                    const char** dtypes, void* stream, void* extra)
// (what MindSpore's ops.Custom(func_type="aot") loads), and the other direction: an op whose
// kernel is such a function in an external shared library (impl kind `aot`).
//
// On a device (seed 004's GPU form): the buffers may be device memory, found by asking the
// device runtimes where each pointer lives (all on one device), and `stream` (a cudaStream_t;
// null: the legacy default stream) is the stream the op's work is queued on, asynchronously, as
// the host expects: results are ordered on that stream, not waited for.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/functional.h"
#include "runtime/registry.h"
#include "runtime/tensor.h"

#define OPFORGE_AOT_EXPORT extern "C" __attribute__((visibility("default")))

namespace opforge::aot {

// Non-zero return codes of an entry point, by the exception that stopped the call.
enum Status : int { kOk = 0, kTypeError = 1, kValueError = 2, kIndexError = 3, kRuntimeError = 4, kOther = 5 };

// The attrs of one call of an entry point, from `extra`: each spec attr is a str attr of the same
// name in MindSpore's AotExtra holding its value as text: Python's repr of a float (exact for
// float64), an int, True/False, the string itself, comma-separated list items, or None for an
// optional attr without a value. Without extra (a plain C caller passes NULL) or without an attr,
// the spec's default is used; a required attr must be given.
class AttrSource {
 public:
  AttrSource(const OpInfo& info, void* extra) : info_(info), extra_(extra) {}

  bool attr_bool(const char* name) const;
  int64_t attr_int(const char* name) const;
  double attr_float(const char* name) const;
  std::string attr_str(const char* name) const;
  std::vector<int64_t> attr_int_list(const char* name) const;
  std::vector<double> attr_float_list(const char* name) const;
  template <typename T>
  std::optional<T> attr_optional(const char* name, T (AttrSource::*convert)(const char*) const) const {
    const std::optional<std::string> text = raw(name);
    if (text && *text == "None") return std::nullopt;
    if (!text && default_of(name) == "None") return std::nullopt;
    return (this->*convert)(name);
  }

 protected:
  const OpInfo& info_;

 private:
  std::optional<std::string> raw(const char* name) const;  // the host's text, if given
  std::string text(const char* name) const;                // the host's text or the default
  std::string default_of(const char* name) const;
  const AttrInfo& attr_info(const char* name) const;

  void* extra_;
};

// One call of an entry point: the host's buffers seen as opforge tensors (no copies) on the device
// they live on, the attrs from `extra` and the host's output buffers.
//
// params holds the present inputs in spec order (absent optional inputs are skipped; `present`
// has bit k set when input k is there), then the outputs.
class Call : public AttrSource {
 public:
  Call(const OpInfo& info, uint32_t present, int nparam, void** params, int* ndims, int64_t** shapes,
       const char** dtypes, void* extra);
  ~Call();  // (gives its wrappers of the host's buffers back to the thread's pool: runtime/borrowed.h)
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  TensorPtr input(size_t k) const { return inputs_[k]; }
  Device device() const { return device_; }  // where the buffers live (the host's when there are none)

  // Copies the results into the host's output buffers (shapes and dtypes must agree), unless
  // the op wrote them there already (the buffers are offered to empty() during body()).
  void set_outputs(const TensorList& outs) const;
  void set_outputs(const TensorPtr& out) const { set_outputs(TensorList{out}); }

  std::vector<BufferOffer>* offers() { return &offers_; }

 private:
  Device device_;
  std::vector<TensorPtr> inputs_;
  std::vector<TensorPtr> outputs_;
  std::vector<BufferOffer> offers_;
};

// One call of an InferShape entry point (what MindSpore asks before it runs an entry point, and
// when it compiles a graph: then dimensions may be unknown, -1 from the host, or a whole shape,
// {-2}): the present inputs' dimensions (kUnknownDim where unknown) and the attrs.
class ShapeCall : public AttrSource {
 public:
  ShapeCall(const OpInfo& info, uint32_t present, int* ndims, int64_t** shapes, void* extra);

  const DimsOf* dims(size_t k) const { return present_[k] ? &inputs_[k] : nullptr; }
  bool unknown_rank() const { return unknown_rank_; }  // an input's rank is not known

 private:
  std::vector<DimsOf> inputs_;
  std::vector<bool> present_;
  bool unknown_rank_ = false;
};

// Output shapes for an InferShape entry point: body(call)'s, with unknown dimensions as -1; every
// output {-2} (rank unknown) when an input's rank is unknown or a rule needs an unknown dimension.
// A rule that fails (shapes that cannot go together; the call itself will raise) also gives {-2}s,
// the message kept for last_error() and written to stderr, as an entry point's failure is.
template <typename Body>
std::vector<std::vector<int64_t>> infer_shapes(const OpInfo& info, uint32_t present, int* ndims, int64_t** shapes,
                                               void* extra, Body&& body) noexcept;

// Runs body(call), turning any exception into a status code and a message kept for
// last_error() and written to stderr (a host such as MindSpore reports only the code).
template <typename Body>
int run(const OpInfo& info, uint32_t present, int nparam, void** params, int* ndims, int64_t** shapes,
        const char** dtypes, void* stream, void* extra, Body&& body) noexcept;

int fail_status(const char* op, const std::exception* e) noexcept;
const std::string& last_error();  // this thread's last failure message ("" if none)
// The process's last failure (any thread's), taken: the next call gives {kOk, ""} until another.
struct Failure {
  int status = kOk;
  std::string message;
};
Failure take_failure();

// The text form of a float or int attr: the whole text (spaces around it aside) must be the
// number, read the same whatever the C locale (a host may run with LC_NUMERIC=de_DE, whose
// strtod stops at the '.'); else TypeError "[op] attr 'name': expected float, got the text '...'".
double parse_float(const char* op, const char* name, const std::string& text);
int64_t parse_int(const char* op, const char* name, const std::string& text);

// ---- attrs from MindSpore's AotExtra (aot_extra.cpp, compiled with the old std::string ABI)

// Whether the host's extra holds attr `name`; if so, *out receives its str value (malloc'ed,
// to be freed by the caller). Returns false when extra is null or has no such attr; throws
// nothing (a host error becomes *error, malloc'ed).
extern "C" bool opforge_aot_extra_str(void* extra, const char* name, char** out, char** error);
// opforge's own AotExtra for the external kernels it calls (ExtraAttrs below): new (null when out
// of memory), delete, and add an attr of kind 0 bool (i), 1 int (i), 2 float (f), 3 str (s),
// 4 list of int (ints, n), 5 list of float (floats, n); false when out of memory.
extern "C" void* opforge_aot_extra_new();
extern "C" void opforge_aot_extra_delete(void* extra);
extern "C" bool opforge_aot_extra_add(void* extra, const char* name, int kind, int64_t i, double f, const char* s,
                                      const int64_t* ints, const double* floats, size_t n);

// The attrs of an aot op, as its external kernel reads them from `extra` when opforge calls it: a
// MindSpore AotExtra holding each attr with MindSpore's types (bool, int64, float (float32, as
// MindSpore keeps a float prim attr), str, lists of int64 and of float). An optional attr without
// a value is left out (HasAttr is false), as MindSpore leaves it out.
class ExtraAttrs {
 public:
  ExtraAttrs();
  ~ExtraAttrs();
  ExtraAttrs(const ExtraAttrs&) = delete;
  ExtraAttrs& operator=(const ExtraAttrs&) = delete;

  void add(const char* name, bool v);
  void add(const char* name, int64_t v);
  void add(const char* name, double v);
  void add(const char* name, const std::string& v);
  void add(const char* name, const std::vector<int64_t>& v);
  void add(const char* name, const std::vector<double>& v);
  template <typename T>
  void add(const char* name, const std::optional<T>& v) {
    if (v) add(name, *v);
  }
  void* extra() const { return extra_; }

 private:
  void* extra_;
};

// Test hook: calls this library's exported `<symbol>InferShape` as MindSpore does (no extra: attrs
// at their defaults) for inputs of these shapes (-1 an unknown dimension, {-2} an unknown rank).
// The symbol names a registered op (opforge_<op>[__without__<input>...]), whose outputs pick the
// entry's signature and whose present inputs must match the shapes given (ValueError otherwise);
// RuntimeError if this library exports no such entry.
std::vector<std::vector<int64_t>> call_infer_shape(const std::string& symbol,
                                                   const std::vector<std::vector<int64_t>>& shapes);

// ---- ops whose kernel is an external AOT function (impl kind `aot`)

using Kernel = int (*)(int, void**, int*, int64_t**, const char**, void*, void*);

// The function `symbol` of library `library` (an absolute path, or a file name looked up in
// $OPFORGE_AOT_PATH's directories, then in the opforge package's directory; never against the
// current directory: a relative path with a directory, or a relative directory in
// $OPFORGE_AOT_PATH, is an error), loaded on first use and kept; failures raise RuntimeError
// naming the paths tried and the symbol.
// Absent (null) optional inputs are left out of params.
struct Resolved {
  std::string path;
  Kernel kernel;
};
Resolved resolve(const char* op, const char* library, const char* symbol);

// Calls an external kernel with the inputs and freshly allocated outputs of the given shapes
// and dtypes on device (the call's: a device kernel gets device pointers and the device's
// current stream, the host's kernel a null stream); a non-zero return raises RuntimeError naming
// the op, library, symbol and code.
// `attrs` (null: none) is the kernel's `extra`; an exception the kernel lets out (its AotExtra
// asked for an attr the op does not have) raises RuntimeError too.
TensorList call_external(const char* op, const char* library, const char* symbol,
                         const TensorList& inputs, const std::vector<Shape>& out_shapes,
                         const std::vector<DType>& out_dtypes, Device device = Device{},
                         const ExtraAttrs* attrs = nullptr);

template <typename Body>
int run(const OpInfo& info, uint32_t present, int nparam, void** params, int* ndims, int64_t** shapes,
        const char** dtypes, void* stream, void* extra, Body&& body) noexcept {
  try {
    Call call(info, present, nparam, params, ndims, shapes, dtypes, extra);
    StreamScope on_stream(info.name, call.device(), stream);
    BufferOfferScope scope(call.offers());
    body(call);
    return kOk;
  } catch (const std::exception& e) {
    return fail_status(info.name, &e);
  } catch (...) {
    return fail_status(info.name, nullptr);
  }
}

std::vector<std::vector<int64_t>> unknown_shapes(const OpInfo& info) noexcept;
// The first output's shape, for a one-output op's InferShape ({-2} if there is none).
std::vector<int64_t> first_shape(std::vector<std::vector<int64_t>>&& shapes) noexcept;
std::vector<std::vector<int64_t>> host_shapes(const std::vector<Shape>& shapes) noexcept;

template <typename Body>
std::vector<std::vector<int64_t>> infer_shapes(const OpInfo& info, uint32_t present, int* ndims, int64_t** shapes,
                                               void* extra, Body&& body) noexcept {
  try {
    ShapeCall call(info, present, ndims, shapes, extra);
    if (call.unknown_rank()) return unknown_shapes(info);
    return host_shapes(body(call));
  } catch (const UnknownShape&) {
    return unknown_shapes(info);
  } catch (const std::exception& e) {
    fail_status(info.name, &e);
  } catch (...) {
    fail_status(info.name, nullptr);
  }
  return unknown_shapes(info);
}

}  // namespace opforge::aot
