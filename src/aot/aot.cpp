// AOT entry points (MindSpore's AOT C ABI) both ways: the host's buffers as opforge tensors for the
// generated entry points, and calls into external kernels for ops of impl kind `aot`.
#include "aot/aot.h"

#include <dlfcn.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <mutex>
#include <sstream>

#include "runtime/borrowed.h"
#include "runtime/errors.h"

namespace opforge::aot {

namespace {

thread_local std::string t_last_error;
// The process's last failure, whichever thread ran the entry point (a host may launch kernels on
// threads of its own): taken once by the host's face (take_failure), as MindSpore's PyNative
// error carries only the status code.
std::mutex g_failure_lock;
Failure g_failure;

TensorPtr wrap_param(const char* op, const char* role, const char* arg, void* data, int ndim,
                     const int64_t* shape, const char* dtype_str, std::optional<Device>* device) {
  if (ndim < 0 || (ndim > 0 && !shape)) fail<ValueError>(op, role, " '", arg, "': bad shape from the host");
  if (!dtype_str) fail<TypeError>(op, role, " '", arg, "': no dtype from the host");
  DType dtype;
  if (!dtype_from_name(dtype_str, &dtype)) {
    fail<TypeError>(op, role, " '", arg, "': unsupported dtype '", dtype_str, "'");
  }
  const int64_t n = checked_numel(op, Shape(shape, shape + ndim), dtype);
  if (n > 0 && !data) fail<ValueError>(op, role, " '", arg, "': null data pointer");
  Device here;
  if (n > 0) {  // every buffer on the device of the first one
    here = locate_pointer(data);
    if (!device->has_value()) {
      *device = here;
    } else if (here != **device) {
      fail<ValueError>(op, role, " '", arg, "' is on ", here.str(), " but the buffers before it are on ", (*device)->str(),
                       ": an AOT call's buffers must all be on one device");
    }
  }
  // (a wrapper recycled per thread: ~Call gives it back)
  return wrap_borrowed(data, static_cast<size_t>(n) * itemsize(dtype), dtype, shape, static_cast<size_t>(ndim), here,
                       false);
}

std::string join_ints(const Shape& s) { return shape_str(s); }

// Whether two of the host's (contiguous) buffers share a byte.
bool overlap(const TensorPtr& a, const TensorPtr& b) {
  if (a->numel() == 0 || b->numel() == 0) return false;
  const auto lo_a = reinterpret_cast<uintptr_t>(a->raw_data());
  const auto lo_b = reinterpret_cast<uintptr_t>(b->raw_data());
  return lo_a < lo_b + b->storage()->nbytes && lo_b < lo_a + a->storage()->nbytes;
}

}  // namespace

namespace {

// The host calls entry points from its own threads and runs its own thread pool (MindSpore's
// spin while a kernel runs): OpenMP teams started from those threads would compete with it for
// the cores (measured: 65536-element mul 10x slower). So parallel regions entered from a host's
// thread use OPFORGE_AOT_THREADS threads (default 1), set once per thread.
void limit_host_thread() {
#ifdef _OPENMP
  static thread_local bool done = false;
  if (done) return;
  done = true;
  int threads = 1;
  if (const char* env = std::getenv("OPFORGE_AOT_THREADS")) threads = std::max(1, std::atoi(env));
  omp_set_num_threads(threads);
#endif
}

}  // namespace

Call::Call(const OpInfo& info, uint32_t present, int nparam, void** params, int* ndims, int64_t** shapes,
           const char** dtypes, void* extra)
    : AttrSource(info, extra) {
  limit_host_thread();
  size_t n_present = 0;
  for (size_t k = 0; k < info.inputs.size(); ++k) n_present += (present >> k) & 1u;
  const size_t expected = n_present + info.outputs.size();
  if (nparam < 0 || static_cast<size_t>(nparam) != expected) {
    fail<ValueError>(info.name, "AOT entry point: expected ", expected, " parameters (", n_present,
                     " inputs, ", info.outputs.size(), " outputs), got ", nparam);
  }
  if (nparam > 0 && (!params || !ndims || !shapes || !dtypes)) {
    fail<ValueError>(info.name, "AOT entry point: null params, ndims, shapes or dtypes");
  }
  inputs_.reserve(info.inputs.size());
  outputs_.reserve(info.outputs.size());
  offers_.reserve(info.outputs.size());
  size_t p = 0;
  std::optional<Device> where;  // the buffers' device, from the first non-empty one
  for (size_t k = 0; k < info.inputs.size(); ++k) {
    if (!((present >> k) & 1u)) {
      inputs_.push_back(nullptr);
      continue;
    }
    inputs_.push_back(wrap_param(info.name, "input", info.inputs[k].name, params[p], ndims[p], shapes[p], dtypes[p],
                                 &where));
    ++p;
  }
  for (size_t k = 0; k < info.outputs.size(); ++k) {
    const ArgInfo& out = info.outputs[k];
    outputs_.push_back(wrap_param(info.name, "output", out.name, params[p], ndims[p], shapes[p], dtypes[p], &where));
    const TensorPtr& t = outputs_.back();
    // two outputs in one buffer: whichever is written last would overwrite the other
    for (size_t j = 0; j < k; ++j) {
      if (overlap(outputs_[j], t)) {
        fail<ValueError>(info.name, "AOT entry point: outputs '", info.outputs[j].name, "' and '", out.name,
                         "' overlap in memory; give each output its own buffer");
      }
    }
    // offered unless it overlaps an input (a host computing in place, which is allowed: the
    // results are copied there at the end); intermediates written there would clobber the input
    // before it is read
    const bool on_input = std::any_of(inputs_.begin(), inputs_.end(),
                                      [&](const TensorPtr& in) { return in && overlap(in, t); });
    if (t->numel() > 0 && !on_input) {
      offers_.push_back(BufferOffer{t->raw_data(), t->dtype(), t->shape(), t->storage()->device});
    }
    ++p;
  }
  device_ = where.value_or(Device{});
  for (const TensorPtr& t : inputs_) {  // (empty buffers: wherever the others are)
    if (t && t->numel() == 0) t->storage()->device = device_;
  }
  for (const TensorPtr& t : outputs_) {
    if (t->numel() == 0) t->storage()->device = device_;
  }
}

Call::~Call() {
  for (TensorPtr& t : inputs_) recycle_borrowed(t);
  for (TensorPtr& t : outputs_) recycle_borrowed(t);
}

ShapeCall::ShapeCall(const OpInfo& info, uint32_t present, int* ndims, int64_t** shapes, void* extra)
    : AttrSource(info, extra) {
  size_t p = 0;
  for (size_t k = 0; k < info.inputs.size(); ++k) {
    const bool here = (present >> k) & 1u;
    present_.push_back(here);
    inputs_.emplace_back();
    if (!here) continue;
    if (!ndims || !shapes) fail<ValueError>(info.name, "InferShape entry point: null ndims or shapes");
    const int n = ndims[p];
    const int64_t* dims = shapes[p];
    ++p;
    if (n < 0 || (n > 0 && !dims)) fail<ValueError>(info.name, "input '", info.inputs[k].name, "': bad shape from the host");
    if (n == 1 && dims[0] == -2) {  // the host's unknown rank
      unknown_rank_ = true;
      continue;
    }
    for (int i = 0; i < n; ++i) {
      if (dims[i] < -1) {
        fail<ValueError>(info.name, "input '", info.inputs[k].name, "': dimension ", dims[i], " from the host");
      }
      inputs_.back().dims.push_back(dims[i] == -1 ? kUnknownDim : dims[i]);
    }
  }
}

std::vector<std::vector<int64_t>> unknown_shapes(const OpInfo& info) noexcept {
  try {
    return std::vector<std::vector<int64_t>>(info.outputs.size(), std::vector<int64_t>{-2});
  } catch (...) {
    return {};
  }
}

std::vector<int64_t> first_shape(std::vector<std::vector<int64_t>>&& shapes) noexcept {
  if (shapes.empty()) {
    try {
      return std::vector<int64_t>{-2};
    } catch (...) {
      return {};
    }
  }
  return std::move(shapes[0]);
}

std::vector<std::vector<int64_t>> host_shapes(const std::vector<Shape>& shapes) noexcept {
  try {
    std::vector<std::vector<int64_t>> out;
    for (const Shape& s : shapes) {
      out.emplace_back(s.begin(), s.end());
      for (int64_t& d : out.back()) {
        if (d == kUnknownDim) d = -1;
      }
    }
    return out;
  } catch (...) {
    return {};
  }
}

const AttrInfo& AttrSource::attr_info(const char* name) const {
  for (const AttrInfo& a : info_.attrs) {
    if (std::strcmp(a.name, name) == 0) return a;
  }
  fail<RuntimeError>(info_.name, "no attr '", name, "'");
}

std::string AttrSource::default_of(const char* name) const { return attr_info(name).default_repr; }

std::optional<std::string> AttrSource::raw(const char* name) const {
  char* out = nullptr;
  char* error = nullptr;
  const bool found = opforge_aot_extra_str(extra_, name, &out, &error);
  if (error) {
    std::string e(error);
    std::free(error);
    fail<RuntimeError>(info_.name, "attr '", name, "': the host's extra failed: ", e);
  }
  if (!found) return std::nullopt;
  std::string s(out ? out : "");
  std::free(out);
  return s;
}

std::string AttrSource::text(const char* name) const {
  std::optional<std::string> t = raw(name);
  if (t) return *t;
  const AttrInfo& a = attr_info(name);
  if (a.required) fail<TypeError>(info_.name, "missing required attr '", name, "' (a str attr in the host's extra)");
  std::string d = a.default_repr;
  // the default is a Python literal: strip list brackets and string quotes to the text form
  if (d.size() >= 2 && ((d.front() == '[' && d.back() == ']') || (d.front() == '(' && d.back() == ')') ||
                        (d.front() == '\'' && d.back() == '\'') || (d.front() == '"' && d.back() == '"'))) {
    d = d.substr(1, d.size() - 2);
  }
  if (!d.empty() && d.back() == ',') d.pop_back();  // "(1,)"
  return d;
}

namespace {

[[noreturn]] void bad_attr(const char* op, const char* name, const char* type, const std::string& text) {
  fail<TypeError>(op, "attr '", name, "': expected ", type, ", got the text '", text, "'");
}

// The number in s with the spaces around it trimmed, or nullopt when anything else is there.
template <typename T>
std::optional<T> parse_number(const std::string& s) {
  const char* b = s.data();
  const char* e = b + s.size();
  while (b < e && *b == ' ') ++b;
  while (e > b && e[-1] == ' ') --e;
  if (b < e && *b == '+' && e - b > 1 && b[1] != '-') ++b;  // from_chars takes no '+'
  T v{};
  const auto [end, ec] = std::from_chars(b, e, v);  // never reads the locale
  if (ec != std::errc() || end != e || b == e) return std::nullopt;
  return v;
}

}  // namespace

double parse_float(const char* op, const char* name, const std::string& s) {
  const std::optional<double> v = parse_number<double>(s);
  if (!v) bad_attr(op, name, "float", s);
  return *v;
}

int64_t parse_int(const char* op, const char* name, const std::string& s) {
  const std::optional<int64_t> v = parse_number<int64_t>(s);
  if (!v) bad_attr(op, name, "int", s);
  return *v;
}

namespace {

std::vector<std::string> split_items(const std::string& s) {
  std::vector<std::string> items;
  if (s.find_first_not_of(' ') == std::string::npos) return items;
  std::string cur;
  std::istringstream is(s);
  while (std::getline(is, cur, ',')) items.push_back(cur);
  if (!items.empty() && items.back().find_first_not_of(' ') == std::string::npos) items.pop_back();
  return items;
}

}  // namespace

bool AttrSource::attr_bool(const char* name) const {
  const std::string s = text(name);
  if (s == "True" || s == "true" || s == "1") return true;
  if (s == "False" || s == "false" || s == "0") return false;
  bad_attr(info_.name, name, "bool (True/False)", s);
}

int64_t AttrSource::attr_int(const char* name) const { return parse_int(info_.name, name, text(name)); }
double AttrSource::attr_float(const char* name) const { return parse_float(info_.name, name, text(name)); }

std::string AttrSource::attr_str(const char* name) const {
  std::string s = text(name);
  return s;
}

std::vector<int64_t> AttrSource::attr_int_list(const char* name) const {
  std::vector<int64_t> v;
  for (const std::string& item : split_items(text(name))) v.push_back(parse_int(info_.name, name, item));
  return v;
}

std::vector<double> AttrSource::attr_float_list(const char* name) const {
  std::vector<double> v;
  for (const std::string& item : split_items(text(name))) v.push_back(parse_float(info_.name, name, item));
  return v;
}

void Call::set_outputs(const TensorList& outs) const {
  if (outs.size() != outputs_.size()) {
    fail<RuntimeError>(info_.name, "AOT entry point: ", outs.size(), " results for ", outputs_.size(), " outputs");
  }
  for (size_t k = 0; k < outs.size(); ++k) {
    const TensorPtr& dst = outputs_[k];
    const TensorPtr& src = outs[k];
    if (src->shape() != dst->shape()) {
      fail<ValueError>(info_.name, "output '", info_.outputs[k].name, "': the host allocated shape ",
                       join_ints(dst->shape()), " but the op gives ", join_ints(src->shape()));
    }
    if (src->dtype() != dst->dtype()) {
      fail<TypeError>(info_.name, "output '", info_.outputs[k].name, "': the host allocated ",
                      dtype_name(dst->dtype()), " but the op gives ", dtype_name(src->dtype()));
    }
    if (src->numel() == 0 || src->raw_data() == dst->raw_data()) continue;
    if (src->is_contiguous() && dst->on_host() && src->on_host()) {
      std::memcpy(dst->raw_data(), src->raw_data(), static_cast<size_t>(src->numel()) * itemsize(src->dtype()));
    } else {
      copy_into(dst, src);
    }
  }
}

int fail_status(const char* op, const std::exception* e) noexcept {
  try {
    t_last_error = e ? e->what() : message(op, "unknown C++ exception");
    std::fprintf(stderr, "opforge AOT entry point failed: %s\n", t_last_error.c_str());
  } catch (...) {
  }
  int status = kOther;
  if (!e) status = kOther;
  else if (dynamic_cast<const TypeError*>(e)) status = kTypeError;
  else if (dynamic_cast<const ValueError*>(e)) status = kValueError;
  else if (dynamic_cast<const IndexError*>(e)) status = kIndexError;
  else if (dynamic_cast<const RuntimeError*>(e)) status = kRuntimeError;
  try {
    std::lock_guard<std::mutex> lock(g_failure_lock);
    g_failure = Failure{status, t_last_error};
  } catch (...) {
  }
  return status;
}

const std::string& last_error() { return t_last_error; }

Failure take_failure() {
  std::lock_guard<std::mutex> lock(g_failure_lock);
  Failure f = std::move(g_failure);
  g_failure = Failure{};
  return f;
}

// ---------------------------------------------------------------------------- external kernels

namespace {

bool is_absolute(const std::string& path) { return !path.empty() && path[0] == '/'; }

// The directory of libopforge.so, made absolute while the process's directory is the one it
// was loaded from (the dynamic loader may name it relatively); empty when unknown.
std::string package_dir() {
  static const std::string dir = [] {
    Dl_info dl{};
    if (!dladdr(reinterpret_cast<void*>(&package_dir), &dl) || !dl.dli_fname) return std::string();
    std::string path = dl.dli_fname;
    if (!is_absolute(path)) {
      char* real = realpath(path.c_str(), nullptr);
      if (!real) return std::string();
      path = real;
      std::free(real);
    }
    return path.substr(0, path.rfind('/'));
  }();
  return dir;
}

// Where a relative library path is looked up: $OPFORGE_AOT_PATH's directories (each must be
// absolute: a relative one would depend on the current directory), then the package's.
std::vector<std::string> search_dirs(const char* op) {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("OPFORGE_AOT_PATH")) {
    std::string cur;
    std::istringstream is(env);
    while (std::getline(is, cur, ':')) {
      if (cur.empty()) continue;
      if (!is_absolute(cur)) {
        fail<RuntimeError>(op, "OPFORGE_AOT_PATH holds the relative directory '", cur,
                           "'; give absolute directories (a relative one would depend on the current directory)");
      }
      dirs.push_back(cur);
    }
  }
  if (std::string pkg = package_dir(); !pkg.empty()) dirs.push_back(pkg);
  return dirs;
}

}  // namespace

std::vector<std::vector<int64_t>> call_infer_shape(const std::string& symbol,
                                                   const std::vector<std::vector<int64_t>>& shapes) {
  // the op and its present inputs, from the symbol (codegen/api.py's aot_symbols): the entry reads
  // one shape per present input and returns one shape per output, so a call with other counts would
  // read past what it is given
  const std::string prefix = "opforge_", without = "__without__";
  if (symbol.compare(0, prefix.size(), prefix) != 0) {
    fail<ValueError>("call_infer_shape", "symbol '", symbol, "' is not opforge_<op>[__without__<input>...]");
  }
  const size_t cut = symbol.find(without);
  const std::string name = symbol.substr(prefix.size(), cut == std::string::npos ? std::string::npos : cut - prefix.size());
  const OpInfo* info = find_op(name);
  if (!info) fail<ValueError>("call_infer_shape", "symbol '", symbol, "' names no registered op ('", name, "')");
  size_t absent = 0;  // the names after __without__, separated by "__"
  for (size_t at = cut == std::string::npos ? cut : cut + without.size(); at != std::string::npos; absent += 1) {
    const size_t next = symbol.find("__", at);
    at = next == std::string::npos ? next : next + 2;
  }
  if (absent > info->inputs.size() || shapes.size() != info->inputs.size() - absent) {
    fail<ValueError>("call_infer_shape", "symbol '", symbol, "' takes ", info->inputs.size() - std::min(absent, info->inputs.size()),
                     " input shapes; got ", shapes.size());
  }
  const bool multi_output = info->outputs.size() > 1;
  Dl_info dl{};
  if (!dladdr(reinterpret_cast<void*>(&package_dir), &dl) || !dl.dli_fname) {
    fail<RuntimeError>("call_infer_shape", "cannot find libopforge.so");
  }
  void* self = dlopen(dl.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
  if (!self) fail<RuntimeError>("call_infer_shape", "cannot open ", dl.dli_fname);
  void* fn = dlsym(self, (symbol + "InferShape").c_str());
  dlclose(self);
  if (!fn) fail<RuntimeError>("call_infer_shape", "no symbol ", symbol, "InferShape");
  std::vector<int> ndims;
  std::vector<int64_t*> ptrs;
  std::vector<std::vector<int64_t>> copies = shapes;
  for (auto& s : copies) {
    ndims.push_back(static_cast<int>(s.size()));
    ptrs.push_back(s.data());
  }
  if (multi_output) {
    using Multi = std::vector<std::vector<int64_t>> (*)(int*, int64_t**, void*);
    return reinterpret_cast<Multi>(fn)(ndims.data(), ptrs.data(), nullptr);
  }
  using Single = std::vector<int64_t> (*)(int*, int64_t**, void*);
  return {reinterpret_cast<Single>(fn)(ndims.data(), ptrs.data(), nullptr)};
}

Resolved resolve(const char* op, const char* library, const char* symbol) {
  static std::mutex mutex;
  static auto* cache = new std::map<std::string, Resolved>();  // never destroyed: handles stay open
  const std::string key = std::string(library) + ":" + symbol;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache->find(key);
  if (it != cache->end()) return it->second;

  const bool absolute = is_absolute(library);
  if (!absolute && (!*library || std::strchr(library, '/'))) {
    fail<RuntimeError>(op, "AOT library '", library, "' (symbol '", symbol, "') must be an absolute path or a "
                       "file name looked up in OPFORGE_AOT_PATH and the package's directory; a relative path "
                       "would depend on the current directory");
  }
  std::vector<std::string> candidates;
  if (absolute) {
    candidates.push_back(library);
  } else {
    for (const std::string& d : search_dirs(op)) candidates.push_back(d + "/" + library);
  }
  void* handle = nullptr;
  std::string path;
  for (const std::string& c : candidates) {
    FILE* f = std::fopen(c.c_str(), "rb");
    if (!f) continue;
    std::fclose(f);
    handle = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* err = dlerror();
      fail<RuntimeError>(op, "cannot load AOT library ", c, ": ", err ? err : "dlopen failed");
    }
    path = c;
    break;
  }
  if (!handle) {
    std::ostringstream tried;
    for (size_t i = 0; i < candidates.size(); ++i) tried << (i ? ", " : "") << candidates[i];
    fail<RuntimeError>(op, "AOT library '", library, "' not found (symbol '", symbol, "'); looked for ",
                       tried.str(), absolute ? "" : " (add its directory to OPFORGE_AOT_PATH)");
  }
  dlerror();
  void* fn = dlsym(handle, symbol);
  if (!fn) {
    const char* err = dlerror();
    fail<RuntimeError>(op, "symbol '", symbol, "' not found in AOT library ", path, err ? ": " : "", err ? err : "");
  }
  Resolved r{path, reinterpret_cast<Kernel>(fn)};
  cache->emplace(key, r);
  return r;
}

ExtraAttrs::ExtraAttrs() : extra_(opforge_aot_extra_new()) {
  if (!extra_) throw std::bad_alloc();
}

ExtraAttrs::~ExtraAttrs() { opforge_aot_extra_delete(extra_); }

namespace {

void added(bool ok) {
  if (!ok) throw std::bad_alloc();
}

}  // namespace

void ExtraAttrs::add(const char* name, bool v) { added(opforge_aot_extra_add(extra_, name, 0, v, 0, nullptr, nullptr, nullptr, 0)); }
void ExtraAttrs::add(const char* name, int64_t v) { added(opforge_aot_extra_add(extra_, name, 1, v, 0, nullptr, nullptr, nullptr, 0)); }
void ExtraAttrs::add(const char* name, double v) { added(opforge_aot_extra_add(extra_, name, 2, 0, v, nullptr, nullptr, nullptr, 0)); }
void ExtraAttrs::add(const char* name, const std::string& v) {
  added(opforge_aot_extra_add(extra_, name, 3, 0, 0, v.c_str(), nullptr, nullptr, 0));
}
void ExtraAttrs::add(const char* name, const std::vector<int64_t>& v) {
  added(opforge_aot_extra_add(extra_, name, 4, 0, 0, nullptr, v.data(), nullptr, v.size()));
}
void ExtraAttrs::add(const char* name, const std::vector<double>& v) {
  added(opforge_aot_extra_add(extra_, name, 5, 0, 0, nullptr, nullptr, v.data(), v.size()));
}

TensorList call_external(const char* op, const char* library, const char* symbol, const TensorList& inputs,
                         const std::vector<Shape>& out_shapes, const std::vector<DType>& out_dtypes, Device device,
                         const ExtraAttrs* attrs) {
  Kernel kernel = resolve(op, library, symbol).kernel;
  TensorList ins;
  for (const TensorPtr& t : inputs) {
    if (t) ins.push_back(contiguous(t));  // the ABI has no strides
  }
  TensorList outs;
  for (size_t k = 0; k < out_shapes.size(); ++k) {
    outs.push_back(empty(out_dtypes[k], out_shapes[k], Format::Default, device));
  }
  void* stream = device.type == DeviceType::CPU ? nullptr : device_runtime(op, device).current_stream(device.index);
  std::vector<void*> params;
  std::vector<int> ndims;
  std::vector<int64_t*> shapes;
  std::vector<const char*> dtypes;
  std::vector<Shape> shape_store;
  for (const TensorList* list : {&ins, &outs}) {
    for (const TensorPtr& t : *list) shape_store.push_back(t->shape());
  }
  size_t i = 0;
  for (const TensorList* list : {&ins, &outs}) {
    for (const TensorPtr& t : *list) {
      params.push_back(t->raw_data());
      ndims.push_back(static_cast<int>(t->dim()));
      shapes.push_back(shape_store[i++].data());
      dtypes.push_back(dtype_name(t->dtype()));
    }
  }
  int rc = 0;
  try {
    rc = kernel(static_cast<int>(params.size()), params.data(), ndims.data(), shapes.data(), dtypes.data(), stream,
                attrs ? attrs->extra() : nullptr);
  } catch (const std::exception& e) {
    fail<RuntimeError>(op, "AOT kernel ", symbol, " in ", library, " failed: ", e.what());
  } catch (...) {
    fail<RuntimeError>(op, "AOT kernel ", symbol, " in ", library, " failed with an unknown exception");
  }
  if (rc != 0) {
    fail<RuntimeError>(op, "AOT kernel ", symbol, " in ", library, " returned ", rc);
  }
  return outs;
}

}  // namespace opforge::aot
