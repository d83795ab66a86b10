// The registration table (one OpInfo per op, rows of dtype x format per target) and the
// call-time check that binds type variables and validates a call against it.
#pragma once

#include <array>
#include <initializer_list>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace opforge {

constexpr int kMaxTypeVars = 4;

struct ArgInfo {
  const char* name;
  int typevar;          // index into OpInfo::typevars, or -1 for a concrete dtype
  DType dtype;          // the concrete dtype when typevar < 0
  bool optional;
  bool differentiable;
};

struct AttrInfo {
  const char* name;
  const char* type;     // bool | int | float | str | list[int] | list[float]
  bool required;
  const char* default_repr;  // Python literal, "" when required
};

struct RowInfo {
  std::array<DType, kMaxTypeVars> vars;  // one dtype per type variable
  Format format;
};

struct TargetInfo {
  const char* name;     // cpu | cuda | ascend
  const char* mindspore_target;  // MindSpore's name of the device: CPU | GPU | Ascend (codegen/targets.py)
  std::vector<RowInfo> rows;
  bool runs = false;    // this build runs the op's calls on the target (its kernels are compiled)
};

struct OpInfo {
  const char* name;
  const char* doc;
  const char* impl;     // expr | cpp | composite
  std::vector<const char*> typevars;
  std::vector<ArgInfo> inputs;
  std::vector<ArgInfo> outputs;
  std::vector<AttrInfo> attrs;
  std::vector<TargetInfo> targets;
  const char* inplace = "";  // the in-place variant's name (add_), or ""
  bool foreach = false;      // opforge.foreach runs it over lists of tensors (spec key foreach)
  // per device type, the target whose rows a call on that device is checked against and whose
  // kernels run it (null: this build cannot run the op there); set by register_op
  std::array<const TargetInfo*, kDeviceTypes> by_device{};
};

// The result of checking a call: the bound type variables, the call's format and its device
// (its inputs' device; the host for an op without inputs).
struct CallInfo {
  std::array<DType, kMaxTypeVars> vars{};
  Format format = Format::Default;
  Device device;
  DType var(int i) const { return vars[static_cast<size_t>(i)]; }
};

// Test hook: when set, check_call reports each call to it (from the thread running the op).
extern void (*on_checked_call)(const OpInfo& info);


// Binds type variables from the inputs (null entries are absent optional inputs), takes the
// call's device from them (RuntimeError when they are on two devices, or when this build cannot
// run the op on that device) and checks dtypes and format against that device's target rows;
// throws TypeError / ValueError / RuntimeError naming op.
CallInfo check_call(const OpInfo& info, std::initializer_list<const Tensor*> inputs);

// Every registered op, in registration order (a copy of the table: for op_info / list_ops).
std::vector<const OpInfo*> registry();
// Adds info to the table, replacing an op of the same name (a reloaded op module's new version).
void register_op(OpInfo& info);
const OpInfo* find_op(const std::string& name);

}  // namespace opforge
