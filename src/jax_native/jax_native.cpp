// opforge's ops as XLA FFI custom calls: the one handler behind every op of opforge.jax.
//
// opforge.jax builds this file on first use against the installed jaxlib's FFI headers
// (jax.ffi.include_dir(), never a copy of them: the typed FFI is a versioned C ABI, and the
// library links no part of jaxlib) and registers its handler as the custom-call target
// "opforge" through jax.ffi.register_ffi_target (see opforge/jax.py and opforge/_jax_native.py).
//
// Every op's JAX primitive lowers to a call of that target with
// - the op's present inputs as operands, in spec order;
// - one result per output, of the shape and dtype the op's meta rule gave at trace time;
// - attributes: "opforge.name", the op's name as register() was given it ("mul" for opforge's
//   own ops, "<module>.<op>" for an op module's), "opforge.abi", a digest of its interface
//   (inputs, attrs, outputs): a call runs the name's latest registration in the process that runs
//   it, its interface checked against "opforge.abi" (nothing in a call is particular to the
//   process that lowered it, so a program's HLO is the same in every process, as jax.export and
//   JAX's persistent compilation cache need; an op module registered again, a newer version,
//   is what its name means from then on),
//   "opforge.inputs", the mask of present inputs,
//   "opforge.widen" and "opforge.narrow", the masks of inputs given as int32 where the op takes
//   int64 and of 64-bit outputs JAX holds in 32 bits (JAX without 64-bit types: they are
//   converted here), and each of the op's attrs that has a value under its own name (bool, int64, double,
//   string, or a dense int64/double array for list attrs).
//
// XLA instantiates each call once (the FFI's instantiate stage, when it loads the executable):
// the attributes are decoded and checked then, the op looked up, into the call's state
// (CallState, a type registered with XLA); each execution reads that state and decodes nothing.
// The handler sees XLA's buffers as opforge tensors (zero copy; inputs read-only), offers the
// result buffers to the op's allocations (runtime/tensor.h's BufferOffer: the op writes its
// results in place), runs the op's entry and copies a result that was not written in place.
// opforge's exceptions become FFI errors carrying the op's message (JAX raises them as
// JaxRuntimeError: INVALID_ARGUMENT / OUT_OF_RANGE / INTERNAL). Nothing may escape the handler.
//
// Errors every device must agree on. In a program split over several devices, an op that checks
// its inputs' values (indices, labels) may fail on one device's rows alone; that device's program
// would stop there while the others wait for it in their next collective (XLA's CPU client
// aborts the process after 40 s; NCCL waits on). opforge.jax lowers such a call, where XLA's
// partitioner splits it, with "opforge.defer": the call then has one more result, an int32 status
// (of the call's batch dims' shape): 0, or a number for the failure (random bits and the error's
// code) under which its error is kept here instead of returned; the call's results hold what the
// op wrote. The program reduces the status over every device (XLA's partitioner all-reduces it)
// and calls this target again with "opforge.check" on it: every device reads the same status and,
// if it is not 0, fails there with the error kept under it (or, if another process kept it, an
// error naming the op, with the code). Nothing of this runs per call of a call that is not deferred.
//
// With OPFORGE_JAX_CUDA (the cu130 wheel), a second handler takes XLA's CUDA stream and runs the
// op on the device its buffers are on, ordered on that stream (registered for platform CUDA).
#include <Python.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <deque>
#include <atomic>
#include <memory>
#include <mutex>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/binding.h"
#include "runtime/borrowed.h"
#include "runtime/device.h"
#include "runtime/errors.h"
#include "runtime/tensor.h"
#include "xla/ffi/api/ffi.h"

namespace {

namespace ffi = xla::ffi;
using opforge::AttrValue;
using opforge::DType;
using opforge::TensorPtr;

constexpr size_t kMaxParams = 16;  // inputs + attrs, and outputs, of one op (as the Python face)

// The ops register() was given, with the name and interface digest opforge.jax gave each: read by
// the handler on XLA's threads, appended to under the GIL (a deque: records never move).
struct Registered {
  const opforge::binding::OpEntry* entry;
  std::string name;
  int64_t abi;
};
std::mutex g_lock;
std::deque<Registered> g_ops;
std::unordered_map<std::string, size_t> g_by_name;  // name -> its latest registration
// This process's random bits, in the numbers its deferred failures are kept under (a status from
// another process names none of them).
const int64_t g_process = []() noexcept {
  uint64_t token = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                   reinterpret_cast<uintptr_t>(&g_ops);
  try {
    std::random_device entropy;
    token ^= (uint64_t{entropy()} << 32) ^ entropy();
  } catch (...) {  // (no entropy source: the clock and where the table is)
  }
  return static_cast<int64_t>(token);
}();

// The op a call names: the op registered last under its name; nullptr and why if there is none,
// or if its interface is not the one the program was lowered with.
const opforge::binding::OpEntry* op_of_call(std::string_view name, int64_t abi, ffi::ErrorCode* code,
                                            std::string* why) {
  std::lock_guard<std::mutex> guard(g_lock);
  const auto it = g_by_name.find(std::string(name));
  if (it == g_by_name.end()) {
    *code = ffi::ErrorCode::kNotFound;
    *why = "[" + std::string(name) + "] is not an op of this process's opforge.jax: a program exported with it "
           "runs where `import opforge.jax` has registered opforge's ops and opforge.jax.register_module() the "
           "op module that defines it";
    return nullptr;
  }
  const Registered* r = &g_ops[it->second];
  if (r->abi != abi) {
    *code = ffi::ErrorCode::kFailedPrecondition;
    *why = "[" + std::string(name) + "] was lowered for another interface of the op (inputs, attrs or outputs) "
           "than this process's: export the program again with the opforge and op module that run it";
    return nullptr;
  }
  return r->entry;
}

// The errors of deferred calls, by the status their failure wrote: read by every device's check
// (the table is emptied when it grows past kMaxFailures: a check then finds nothing and says so).
struct Failure {
  ffi::ErrorCode code;
  std::string message;
};
constexpr size_t kMaxFailures = 1024;
std::mutex g_failures_lock;
std::unordered_map<int32_t, Failure> g_failures;
std::atomic<uint32_t> g_failure_count{0};

bool to_opforge_dtype(ffi::DataType t, DType* out) {
  switch (t) {
    case ffi::DataType::PRED: *out = DType::Bool; return true;
    case ffi::DataType::U8: *out = DType::UInt8; return true;
    case ffi::DataType::S8: *out = DType::Int8; return true;
    case ffi::DataType::S16: *out = DType::Int16; return true;
    case ffi::DataType::S32: *out = DType::Int32; return true;
    case ffi::DataType::S64: *out = DType::Int64; return true;
    case ffi::DataType::F16: *out = DType::Float16; return true;
    case ffi::DataType::BF16: *out = DType::BFloat16; return true;
    case ffi::DataType::F32: *out = DType::Float32; return true;
    case ffi::DataType::F64: *out = DType::Float64; return true;
    default: return false;
  }
}

// An error the op's Python function would raise, as an FFI error with the same message.
ffi::Error error(ffi::ErrorCode code, const std::string& op, const std::string& message) {
  return ffi::Error(code, "[" + op + "] " + message);
}

// XLA's buffer as an opforge tensor (no copy; the buffer outlives the call; a wrapper recycled
// per thread: Wrapped gives it back).
TensorPtr wrap(ffi::AnyBuffer b, DType dtype, opforge::Device device, bool readonly) {
  const auto dims = b.dimensions();
  return opforge::wrap_borrowed(b.untyped_data(), b.size_bytes(), dtype, dims.begin(), dims.size(), device, readonly);
}

// A call's wrappers of XLA's buffers, given back to this thread's pool however the call ends
// (inputs[k] only while borrowed bit k is set: a widened input is opforge's own tensor).
struct Wrapped {
  TensorPtr inputs[kMaxParams], results[kMaxParams];
  uint32_t borrowed = 0;
  ~Wrapped() {
    for (size_t k = 0; k < kMaxParams; ++k) {
      if (borrowed & (1u << k)) opforge::recycle_borrowed(inputs[k]);
    }
    for (TensorPtr& t : results) opforge::recycle_borrowed(t);
  }
};

// One attr of the op from the call's attributes, by the type its spec declares; monostate when
// the call has none under that name (an optional attr without a value).
template <typename T>
bool get(const ffi::Dictionary& attrs, const char* name, T* out) {
  auto v = attrs.get<T>(name);
  if (v.has_error()) return false;
  *out = *v;
  return true;
}

bool to_attr(const ffi::Dictionary& attrs, const opforge::AttrInfo& a, AttrValue* out) {
  const std::string_view type = a.type;
  if (!attrs.contains(a.name)) {
    *out = std::monostate{};
    return true;
  }
  if (type == "bool") {
    bool v;
    if (!get(attrs, a.name, &v)) return false;
    *out = v;
  } else if (type == "int") {
    int64_t v;
    if (!get(attrs, a.name, &v)) return false;
    *out = v;
  } else if (type == "float") {
    double v;
    if (!get(attrs, a.name, &v)) return false;
    *out = v;
  } else if (type == "str") {
    std::string_view v;
    if (!get(attrs, a.name, &v)) return false;
    *out = std::string(v);
  } else if (type == "list[int]") {
    ffi::Span<const int64_t> v;
    if (!get(attrs, a.name, &v)) return false;
    *out = std::vector<int64_t>(v.begin(), v.end());
  } else if (type == "list[float]") {
    ffi::Span<const double> v;
    if (!get(attrs, a.name, &v)) return false;
    *out = std::vector<double>(v.begin(), v.end());
  } else {
    return false;
  }
  return true;
}

// What a custom call's attributes say, decoded once when XLA instantiates the call (the FFI's
// instantiate stage) and read by each execution: the op, the masks, and the attr values.
struct CallState {
  static ffi::TypeId id;
  const opforge::binding::OpEntry* entry = nullptr;
  int64_t mask = 0, widen = 0, narrow = 0;
  AttrValue values[kMaxParams];
  bool defer = false;  // its error kept, its last result the status (see the top)
  bool check = false;  // the check of a deferred call's status: no op runs
  std::string name;    // (a check's op, for its message)
};
ffi::TypeId CallState::id = {};
XLA_FFI_TypeInfo call_state_info = ffi::MakeTypeInfo<CallState>();

ffi::ErrorOr<std::unique_ptr<CallState>> instantiate(ffi::Dictionary attrs) noexcept {
  using Failed = ffi::Unexpected<ffi::Error>;
  try {
    auto state = std::make_unique<CallState>();
    int64_t abi = 0, flag = 0;
    std::string_view op_name;
    if (get(attrs, "opforge.check", &flag) && flag != 0) {
      if (!get(attrs, "opforge.name", &op_name)) {
        return Failed(ffi::Error::InvalidArgument("opforge: a check without its opforge.name"));
      }
      state->check = true;
      state->name = std::string(op_name);
      return state;
    }
    state->defer = get(attrs, "opforge.defer", &flag) && flag != 0;
    if (!get(attrs, "opforge.name", &op_name) || !get(attrs, "opforge.abi", &abi) ||
        !get(attrs, "opforge.inputs", &state->mask) || !get(attrs, "opforge.widen", &state->widen) ||
        !get(attrs, "opforge.narrow", &state->narrow)) {
      return Failed(ffi::Error::InvalidArgument(
          "opforge: a call without its opforge.* attributes (name, abi, inputs, widen, narrow): a program "
          "lowered by another version of opforge.jax? Export it again"));
    }
    ffi::ErrorCode code = ffi::ErrorCode::kInternal;
    std::string why;
    state->entry = op_of_call(op_name, abi, &code, &why);
    if (state->entry == nullptr) return Failed(ffi::Error(code, why));
    const opforge::OpInfo& info = *state->entry->info;
    if (info.attrs.size() > kMaxParams) {  // (register() refuses such ops: never here)
      return Failed(error(ffi::ErrorCode::kInternal, info.name, "more attrs than the handler takes"));
    }
    for (size_t a = 0; a < info.attrs.size(); ++a) {
      if (!to_attr(attrs, info.attrs[a], &state->values[a])) {
        return Failed(error(ffi::ErrorCode::kInvalidArgument, info.name,
                            std::string("attr '") + info.attrs[a].name + "' is not a " + info.attrs[a].type));
      }
      if (std::holds_alternative<std::monostate>(state->values[a])) {  // (not in the call: its default)
        if (info.attrs[a].required) {
          return Failed(error(ffi::ErrorCode::kInvalidArgument, info.name,
                              std::string("attr '") + info.attrs[a].name + "' is required"));
        }
        if (a < state->entry->defaults.size() && state->entry->defaults[a]) state->values[a] = *state->entry->defaults[a];
      }
    }
    return state;
  } catch (const std::exception& e) {
    return Failed(ffi::Error(ffi::ErrorCode::kInternal, std::string("opforge: ") + e.what()));
  }
}

// Sets every element of result j, a deferred call's int32 status, to value (on device, ordered
// on stream).
void set_status(const std::string& name, ffi::RemainingRets rets, size_t j, opforge::Device device, void* stream,
                int32_t value) {
  auto r = rets.get<ffi::AnyBuffer>(j);
  if (r.has_error() || (*r)->element_type() != ffi::DataType::S32) {
    throw std::runtime_error("[" + name + "] a deferred call without its int32 status");
  }
  void* p = (*r)->untyped_data();
  const auto n = static_cast<int64_t>((*r)->element_count());
  if (n == 0) return;
  if (device.type == opforge::DeviceType::CPU) {
    std::fill_n(static_cast<int32_t*>(p), n, value);
    return;
  }
  opforge::StreamScope on_stream(name.c_str(), device, stream);
  opforge::device_runtime(name.c_str(), device).fill(name.c_str(), device.index, p, n, sizeof value, &value);
}

// A deferred call's error (see the top): kept under a number of its own (26 bits from this
// process's token and a count, then the error's code in 5), which its status is set to; the error
// itself when the status cannot be written.
ffi::Error defer(const std::string& name, ffi::RemainingRets rets, opforge::Device device, void* stream,
                 ffi::ErrorCode code, const std::string& message) noexcept {
  try {
    uint32_t id = (static_cast<uint32_t>(g_process) ^ ++g_failure_count) & 0x3ffffffu;
    if (id == 0) id = 1;
    const auto status = static_cast<int32_t>(id << 5 | (static_cast<uint32_t>(code) & 31u));
    {
      std::lock_guard<std::mutex> guard(g_failures_lock);
      if (g_failures.size() >= kMaxFailures) g_failures.clear();
      g_failures[status] = Failure{code, message};
    }
    set_status(name, rets, rets.size() - 1, device, stream, status);
    return ffi::Error::Success();
  } catch (...) {
    return ffi::Error(code, message);
  }
}

// A deferred call's check: operand 0 the call's status reduced over every device (each element
// the same), the call's results after it, passed on as the check's results (the same buffers
// where XLA keeps the aliasing, else copied). Fails with the error kept under the status when it
// is not 0.
ffi::Error check(const CallState& state, ffi::RemainingArgs args, ffi::RemainingRets rets, bool on_device,
                 void* stream) noexcept {
  try {
    auto b = args.get<ffi::AnyBuffer>(0);
    if (args.size() != rets.size() + 1 || b.has_error() || b->element_type() != ffi::DataType::S32) {
      return error(ffi::ErrorCode::kInvalidArgument, state.name,
                   "a check takes the call's int32 status and results, and gives the results");
    }
    int32_t status = 0;
    opforge::Device device = on_device ? opforge::locate_pointer(b->untyped_data()) : opforge::Device{};
    if (b->element_count() > 0 && device.type == opforge::DeviceType::CPU) {
      std::memcpy(&status, b->untyped_data(), sizeof status);
    } else if (b->element_count() > 0) {
      opforge::StreamScope on_stream(state.name.c_str(), device, stream);
      opforge::device_runtime(state.name.c_str(), device)
          .copy(state.name.c_str(), &status, opforge::Device{}, b->untyped_data(), device, sizeof status);
    }
    if (status == 0) {  // (the results passed on: a copy where XLA made one)
      for (size_t j = 0; j < rets.size(); ++j) {
        auto in = args.get<ffi::AnyBuffer>(j + 1);
        auto out = rets.get<ffi::AnyBuffer>(j);
        if (in.has_error() || out.has_error() || in->size_bytes() != (*out)->size_bytes()) {
          return error(ffi::ErrorCode::kInvalidArgument, state.name, "a check's result differs from its operand");
        }
        if (in->size_bytes() == 0 || in->untyped_data() == (*out)->untyped_data()) continue;
        if (device.type == opforge::DeviceType::CPU && on_device) device = opforge::locate_pointer(in->untyped_data());
        if (device.type == opforge::DeviceType::CPU) {
          std::memcpy((*out)->untyped_data(), in->untyped_data(), in->size_bytes());
        } else {
          opforge::StreamScope on_stream(state.name.c_str(), device, stream);
          opforge::device_runtime(state.name.c_str(), device)
              .copy(state.name.c_str(), (*out)->untyped_data(), device, in->untyped_data(), device, in->size_bytes());
        }
      }
      return ffi::Error::Success();
    }
    {
      std::lock_guard<std::mutex> guard(g_failures_lock);
      if (auto it = g_failures.find(status); it != g_failures.end()) {
        return ffi::Error(it->second.code, it->second.message);
      }
    }
    const int32_t code = status & 31;
    const bool known = code > 0 && code <= static_cast<int32_t>(ffi::ErrorCode::kUnauthenticated);
    return error(known ? static_cast<ffi::ErrorCode>(code) : ffi::ErrorCode::kInternal, state.name,
                 "an input failed the op's checks on a device of another process (an index or label out of "
                 "range, say); that process has the op's message");
  } catch (const std::exception& e) {
    return error(ffi::ErrorCode::kInternal, state.name, e.what());
  } catch (...) {
    return error(ffi::ErrorCode::kInternal, state.name, "an unknown exception");
  }
}

// Runs the call on device (the host, or the device XLA's buffers are on, ordered on stream).
ffi::Error run(const CallState* state, ffi::RemainingArgs args, ffi::RemainingRets rets, bool on_device,
               void* stream) noexcept {
  if (state != nullptr && state->check) return check(*state, args, rets, on_device, stream);
  std::string name = "opforge";
  // where the buffers are: the host, or the device a device call's first buffer is on
  opforge::Device device;
  if (on_device) {
    for (size_t k = 0; k < args.size() && device.type == opforge::DeviceType::CPU; ++k) {
      auto b = args.get<ffi::AnyBuffer>(k);
      if (b.has_value() && b->size_bytes() > 0) device = opforge::locate_pointer(b->untyped_data());
    }
    for (size_t j = 0; j < rets.size() && device.type == opforge::DeviceType::CPU; ++j) {
      auto r = rets.get<ffi::AnyBuffer>(j);
      if (r.has_value() && (*r)->size_bytes() > 0) device = opforge::locate_pointer((*r)->untyped_data());
    }
  }
  ffi::ErrorCode code = ffi::ErrorCode::kInternal;
  std::string message;
  try {
    if (state == nullptr || state->entry == nullptr) {
      return ffi::Error::Internal("opforge: a call executed without its instantiated state");
    }
    const opforge::binding::OpEntry* entry = state->entry;
    const int64_t mask = state->mask, widen = state->widen, narrow = state->narrow;
    const opforge::OpInfo& info = *entry->info;
    name = info.name;
    const size_t n_in = info.inputs.size(), n_out = info.outputs.size();
    if (n_in + info.attrs.size() > kMaxParams || n_out > kMaxParams || n_out + state->defer != rets.size()) {
      return error(ffi::ErrorCode::kInvalidArgument, name,
                   "the call has " + std::to_string(rets.size()) + " results; the op has " + std::to_string(n_out) +
                       (state->defer ? " and the status" : ""));
    }
    // (from here on the device's work, the widening copies included, is ordered on XLA's stream;
    // declared before the wrappers: a widened input is freed on that stream too)
    opforge::StreamScope on_stream(info.name, device, stream);

    Wrapped wrapped;
    TensorPtr* inputs = wrapped.inputs;
    size_t given = 0;
    for (size_t k = 0; k < n_in; ++k) {
      if (!(mask & (int64_t{1} << k))) continue;
      auto b = args.get<ffi::AnyBuffer>(given++);
      if (b.has_error()) return error(ffi::ErrorCode::kInvalidArgument, name, "fewer operands than inputs present");
      DType dtype;
      if (!to_opforge_dtype(b->element_type(), &dtype)) {
        return error(ffi::ErrorCode::kInvalidArgument, name,
                     std::string("input '") + info.inputs[k].name + "' has a dtype opforge does not have; supported "
                     "dtypes: bool, uint8, int8, int16, int32, int64, float16, bfloat16, float32, float64");
      }
      inputs[k] = wrap(*b, dtype, device, true);
      wrapped.borrowed |= 1u << k;
      if (widen & (int64_t{1} << k)) {  // (an int32 array where the op takes int64: JAX without x64)
        TensorPtr wide = opforge::empty(DType::Int64, inputs[k]->shape(), opforge::Format::Default, device);
        opforge::copy_into(wide, inputs[k]);
        opforge::recycle_borrowed(inputs[k]);
        wrapped.borrowed &= ~(1u << k);
        inputs[k] = std::move(wide);
      }
    }
    if (given != args.size()) {
      return error(ffi::ErrorCode::kInvalidArgument, name,
                   std::to_string(args.size()) + " operands for " + std::to_string(given) + " inputs present");
    }
    // (the op's entry moves its attrs out: a copy per execution; none for an op without attrs)
    std::vector<AttrValue> values(state->values, state->values + info.attrs.size());
    TensorPtr* results = wrapped.results;
    std::vector<opforge::BufferOffer> offers;
    offers.reserve(n_out);
    for (size_t j = 0; j < n_out; ++j) {
      auto r = rets.get<ffi::AnyBuffer>(j);
      if (r.has_error()) return r.error();
      DType dtype;
      if (!to_opforge_dtype((*r)->element_type(), &dtype)) {
        return error(ffi::ErrorCode::kInternal, name, "a result of a dtype opforge does not have");
      }
      results[j] = wrap(**r, dtype, device, false);
      if ((*r)->size_bytes() > 0 && !(narrow & (int64_t{1} << j))) {
        offers.push_back(opforge::BufferOffer{(*r)->untyped_data(), dtype, results[j]->shape(), device});
      }
    }
    TensorPtr outputs[kMaxParams];
    {
      opforge::BufferOfferScope scope(&offers);
      entry->call(inputs, values.data(), outputs);
      for (size_t j = 0; j < n_out; ++j) {
        const opforge::Tensor& got = *outputs[j];
        const opforge::Tensor& want = *results[j];
        // (a narrowed result: the op's int64 or float64 written into JAX's 32-bit array, as JAX
        // without 64-bit types holds it; copy_into converts)
        const bool narrowed = (narrow & (int64_t{1} << j)) != 0;
        if (got.shape() != want.shape() || (got.dtype() != want.dtype() && !narrowed)) {
          return error(ffi::ErrorCode::kInternal, name,
                       "output " + std::to_string(j) + " is " + opforge::shape_str(got.shape()) +
                           ", not the shape and dtype its meta rule gave at trace time " + opforge::shape_str(want.shape()));
        }
        if (got.numel() > 0 && got.raw_data() != want.raw_data()) opforge::copy_into(results[j], outputs[j]);
      }
    }
    if (state->defer) set_status(name, rets, n_out, device, stream, 0);
    return ffi::Error::Success();
  } catch (const opforge::TypeError& e) {
    code = ffi::ErrorCode::kInvalidArgument;
    message = e.what();
  } catch (const opforge::ValueError& e) {
    code = ffi::ErrorCode::kInvalidArgument;
    message = e.what();
  } catch (const opforge::IndexError& e) {
    code = ffi::ErrorCode::kOutOfRange;
    message = e.what();
  } catch (const opforge::MemoryError& e) {
    code = ffi::ErrorCode::kResourceExhausted;
    message = e.what();
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "[" + name + "] an unknown exception";
  }
  if (state->defer) return defer(name, rets, device, stream, code, message);
  return ffi::Error(code, message);
}

ffi::Error call_host(CallState* state, ffi::RemainingArgs args, ffi::RemainingRets rets) {
  return run(state, args, rets, false, nullptr);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(OpforgeXlaInstantiate, instantiate, ffi::Ffi::BindInstantiate().Attrs());
XLA_FFI_DEFINE_HANDLER_SYMBOL(
    OpforgeXlaCall, call_host,
    ffi::Ffi::Bind().Ctx<ffi::State<CallState>>().RemainingArgs().RemainingRets());

#ifdef OPFORGE_JAX_CUDA
struct CUstream_st;  // (CUDA's stream type, declared as cuda_runtime.h does: no CUDA headers needed)
using cudaStream_t = CUstream_st*;
namespace {

ffi::Error call_cuda(cudaStream_t stream, CallState* state, ffi::RemainingArgs args, ffi::RemainingRets rets) {
  return run(state, args, rets, true, stream);
}
}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(
    OpforgeXlaCallCuda, call_cuda,
    ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>().Ctx<ffi::State<CallState>>().RemainingArgs().RemainingRets());
#endif

// ---------------------------------------------------------------------------- the Python module

namespace {

// register(fn, name, abi) -> the op's number: fn a function of opforge._C.ops or of an op module,
// name what calls name it by ("mul", "<module>.<op>"), abi the digest of its interface.
PyObject* register_op(PyObject*, PyObject* args) {
  PyObject* fn;
  const char* name;
  long long abi;
  if (!PyArg_ParseTuple(args, "OsL:register", &fn, &name, &abi)) return nullptr;
  const opforge::binding::OpEntry* entry = opforge_op_entry(fn);
  if (entry == nullptr) {
    PyErr_SetString(PyExc_TypeError, "opforge.jax: not an opforge op function");
    return nullptr;
  }
  if (entry->info->inputs.size() + entry->info->attrs.size() > kMaxParams || entry->info->outputs.size() > kMaxParams) {
    PyErr_Format(PyExc_ValueError, "[%s] has more parameters than opforge.jax's handler takes", entry->info->name);
    return nullptr;
  }
  std::lock_guard<std::mutex> guard(g_lock);
  size_t n = 0;
  while (n < g_ops.size() && !(g_ops[n].entry == entry && g_ops[n].name == name && g_ops[n].abi == abi)) ++n;
  if (n == g_ops.size()) g_ops.push_back(Registered{entry, name, static_cast<int64_t>(abi)});
  g_by_name[name] = n;  // (a module registered again under its name: its ops are the ones calls by name mean)
  return PyLong_FromSize_t(n);
}

// handler(platform) -> a PyCapsule of the handler for "cpu" or "cuda" (jax.ffi.register_ffi_target's).
PyObject* capsule(void* p) { return PyCapsule_New(p, nullptr, nullptr); }

// {stage: capsule} for stages' handlers (jax.ffi.register_ffi_target's fn); nullptr with an error set.
PyObject* stages(void* instantiate, void* execute) {
  PyObject* d = PyDict_New();
  for (auto [key, fn] : {std::pair<const char*, void*>{"instantiate", instantiate}, {"execute", execute}}) {
    PyObject* c = d ? capsule(fn) : nullptr;
    if (c == nullptr || PyDict_SetItemString(d, key, c) != 0) {
      Py_XDECREF(c);
      Py_XDECREF(d);
      return nullptr;
    }
    Py_DECREF(c);
  }
  return d;
}

PyObject* handler(PyObject*, PyObject* arg) {
  const char* platform = PyUnicode_AsUTF8(arg);
  if (platform == nullptr) return nullptr;
  void* instantiate = reinterpret_cast<void*>(&OpforgeXlaInstantiate);
  if (std::strcmp(platform, "cpu") == 0) return stages(instantiate, reinterpret_cast<void*>(&OpforgeXlaCall));
#ifdef OPFORGE_JAX_CUDA
  if (std::strcmp(platform, "cuda") == 0) return stages(instantiate, reinterpret_cast<void*>(&OpforgeXlaCallCuda));
#endif
  PyErr_Format(PyExc_ValueError, "opforge.jax: no handler for platform '%s' in this build", platform);
  return nullptr;
}

// state_type() -> {"type_id": capsule, "type_info": capsule}: the instantiated state's type
// (jax.ffi.register_ffi_type's registration; XLA assigns the id).
PyObject* state_type(PyObject*, PyObject*) {
  PyObject* id = capsule(&CallState::id);
  PyObject* info = id ? capsule(&call_state_info) : nullptr;
  PyObject* d = info ? Py_BuildValue("{sOsO}", "type_id", id, "type_info", info) : nullptr;
  Py_XDECREF(id);
  Py_XDECREF(info);
  return d;
}

PyMethodDef methods[] = {
    {"register", register_op, METH_VARARGS,
     "register(fn, name, abi) -> int: the number of fn's op (a function of opforge._C.ops or of an op module) in "
     "the handler's table; calls name it by name and abi (their opforge.name and opforge.abi attributes), the "
     "name's latest registration running"},
    {"handler", handler, METH_O,
     "handler(platform) -> {stage: PyCapsule}: the FFI handlers (instantiate, execute) for 'cpu' or 'cuda'"},
    {"state_type", state_type, METH_NOARGS,
     "state_type() -> {'type_id': PyCapsule, 'type_info': PyCapsule}: the type of the calls' instantiated state"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "opforge_jax_native",
                          "opforge's ops as XLA FFI custom calls (built by opforge.jax on first use)", -1, methods,
                          nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit_opforge_jax_native() { return PyModule_Create(&module_def); }
