// Registration table storage and the call-time dtype/format check.
#include "runtime/registry.h"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <sstream>

namespace opforge {

void (*on_checked_call)(const OpInfo& info) = nullptr;

namespace {
// The table and its lock, never destroyed (as the ops' rows: a thread may look an op up at exit).
// Ops register when their module loads (opforge.load may load one while other threads call ops),
// and the AOT face looks them up on its callers' threads.
struct Table {
  std::mutex lock;
  std::vector<const OpInfo*> ops;
};
Table& table() {
  static Table* t = new Table();
  return *t;
}
}  // namespace

std::vector<const OpInfo*> registry() {
  Table& t = table();
  std::lock_guard<std::mutex> hold(t.lock);
  return t.ops;
}

void register_op(OpInfo& info) {
  info.by_device = {};
  for (const auto& t : info.targets) {
    for (int d = 0; d < kDeviceTypes; ++d) {
      if (t.runs && std::strcmp(t.name, device_type_name(static_cast<DeviceType>(d))) == 0) info.by_device[d] = &t;
    }
  }
  Table& t = table();
  std::lock_guard<std::mutex> hold(t.lock);
  // An op module loaded again after its spec changed (opforge.load) registers its new version
  for (const OpInfo*& op : t.ops) {
    if (std::strcmp(op->name, info.name) == 0) {
      op = &info;
      return;
    }
  }
  t.ops.push_back(&info);
}

const OpInfo* find_op(const std::string& name) {
  Table& t = table();
  std::lock_guard<std::mutex> hold(t.lock);
  for (const OpInfo* op : t.ops) {
    if (name == op->name) return op;
  }
  return nullptr;
}

namespace {

std::string supported_list(const OpInfo& info, const TargetInfo& target) {
  // "T=float32, T=float64" style, listing the distinct type-variable bindings.
  std::vector<std::string> seen;
  for (const auto& row : target.rows) {
    std::string s;
    for (size_t v = 0; v < info.typevars.size(); ++v) {
      s += std::string(v ? ", " : "") + dtype_name(row.vars[v]);
    }
    if (std::find(seen.begin(), seen.end(), s) == seen.end()) seen.push_back(s);
  }
  std::string out;
  for (size_t i = 0; i < seen.size(); ++i) out += (i ? "; " : "") + seen[i];
  return out;
}

std::string typevar_names(const OpInfo& info) {
  std::string s;
  for (size_t v = 0; v < info.typevars.size(); ++v) s += std::string(v ? ", " : "") + info.typevars[v];
  return s;
}

// RuntimeError: the op cannot run on device in this build, saying why.
[[noreturn]] void no_kernel(const OpInfo& info, Device device) {
  const char* target = device_type_name(device.type);
  std::string listed;
  bool has_rows = false;
  for (const auto& t : info.targets) {
    listed += std::string(listed.empty() ? "" : ", ") + t.name;
    has_rows = has_rows || std::strcmp(t.name, target) == 0;
  }
  if (!has_rows) {
    fail<RuntimeError>(info.name, "has no kernel for target ", target, " (the spec's targets: ", listed, ")");
  }
  fail<RuntimeError>(info.name, "has no kernel for target ", target, " in this build (its targets: ", built_targets(),
                     "; ", target, " kernels of ", info.impl, " ops are not generated yet)");
}

}  // namespace

CallInfo check_call(const OpInfo& info, std::initializer_list<const Tensor*> inputs) {
  if (on_checked_call) on_checked_call(info);
  CallInfo call;
  const Tensor* first = nullptr;
  size_t first_index = 0, k = 0;
  for (const Tensor* t : inputs) {
    if (t && !first) {
      first = t;
      first_index = k;
    } else if (t && t->device() != first->device()) {
      fail<RuntimeError>(info.name, "inputs are on different devices: '", info.inputs[first_index].name, "' on ",
                         first->device().str(), ", '", info.inputs[k].name, "' on ", t->device().str());
    }
    ++k;
  }
  if (first) call.device = first->device();
  if (call.device.type != DeviceType::CPU) {
    for (const Tensor* t : inputs) {
      if (t) note_device_use(*t);  // (a graph being captured keeps what its work reads)
    }
  }
  const TargetInfo* target = info.by_device[static_cast<size_t>(call.device.type)];
  if (!target) no_kernel(info, call.device);
  std::array<int, kMaxTypeVars> bound_by{-1, -1, -1, -1};
  bool any_format = false;
  size_t i = 0;
  for (const Tensor* t : inputs) {
    const ArgInfo& arg = info.inputs[i];
    if (!t) {
      if (!arg.optional) fail<TypeError>(info.name, "input '", arg.name, "' is required");
      ++i;
      continue;
    }
    if (arg.typevar < 0) {
      if (t->dtype() != arg.dtype) {
        fail<TypeError>(info.name, "input '", arg.name, "' must be ", dtype_name(arg.dtype), ", got ",
                        dtype_name(t->dtype()));
      }
    } else {
      const auto v = static_cast<size_t>(arg.typevar);
      if (bound_by[v] < 0) {
        call.vars[v] = t->dtype();
        bound_by[v] = static_cast<int>(i);
      } else if (call.vars[v] != t->dtype()) {
        fail<TypeError>(info.name, "inputs '", info.inputs[static_cast<size_t>(bound_by[v])].name, "' (",
                        dtype_name(call.vars[v]), ") and '", arg.name, "' (", dtype_name(t->dtype()),
                        ") must have the same dtype (type variable ", info.typevars[v], ")");
      }
    }
    if (t->format() != Format::Default) {
      if (any_format && call.format != t->format()) {
        fail<ValueError>(info.name, "inputs mix formats ", format_name(call.format), " and ",
                         format_name(t->format()));
      }
      call.format = t->format();
      any_format = true;
    }
    ++i;
  }
  const size_t nv = info.typevars.size();
  bool dtype_ok = false;
  for (const auto& row : target->rows) {
    bool match = true;
    for (size_t v = 0; v < nv; ++v) match = match && row.vars[v] == call.vars[v];
    if (!match) continue;
    dtype_ok = true;
    if (row.format == call.format) return call;
  }
  std::ostringstream given;
  for (size_t v = 0; v < nv; ++v) given << (v ? ", " : "") << dtype_name(call.vars[v]);
  if (!dtype_ok) {
    fail<TypeError>(info.name, "dtype ", given.str(), " is not supported on target ", target->name,
                    "; supported (", typevar_names(info), "): ", supported_list(info, *target));
  }
  std::string formats;
  for (const auto& row : target->rows) {
    bool match = true;
    for (size_t v = 0; v < nv; ++v) match = match && row.vars[v] == call.vars[v];
    if (match && formats.find(format_name(row.format)) == std::string::npos) {
      formats += std::string(formats.empty() ? "" : ", ") + format_name(row.format);
    }
  }
  fail<TypeError>(info.name, "format ", format_name(call.format), " is not supported on target ",
                  target->name, "; supported: ", formats);
}

}  // namespace opforge
