// An op's entry points as the Python face calls them, declared without Python or pybind11: a
// generated op translation unit exports one OpEntry (plain data and two functions), and
// python/python.cpp, the only pybind11 code, binds Python arguments to it by the OpInfo's parameters.
// Keeping pybind11 out of generated code is what makes an op module compile in about a second.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "runtime/autograd.h"  // TensorMeta
#include "runtime/registry.h"
#include "runtime/tensor.h"

namespace opforge {

// One attr's value (monostate: None, an optional attr without a value).
using AttrValue = std::variant<std::monostate, bool, int64_t, double, std::string, std::vector<int64_t>,
                               std::vector<double>>;

namespace binding {

// An op's Python-facing entry: its row, its docstring, its attrs' defaults and two functions taking
// the converted parameters (inputs: null for absent optional ones; attrs: one value per attr, of
// the type AttrInfo::type names, or monostate for an optional attr given None). The attrs are the
// call's own: the functions may move them out.
struct OpEntry {
  const OpInfo* info;
  const char* doc;
  std::vector<std::optional<AttrValue>> defaults;  // per attr; nullopt: required
  // Runs the op; writes one tensor per output.
  void (*call)(const TensorPtr* inputs, AttrValue* attrs, TensorPtr* outputs);
  // The outputs' shapes and dtypes, without running it.
  std::vector<TensorMeta> (*meta)(const TensorPtr* inputs, AttrValue* attrs);
};

// An attr's value, moved out, as the op's C++ API takes it (python.cpp converted it to T by its
// AttrInfo).
template <typename T>
T&& take(AttrValue& v) {
  return std::move(*std::get_if<T>(&v));
}

template <typename T>
std::optional<T> take_optional(AttrValue& v) {
  if (T* p = std::get_if<T>(&v)) return std::move(*p);
  return std::nullopt;
}

// What each generated `register_<op>()` is: it adds the op's row to the registry and returns its entry.
using RegisterOp = const OpEntry& (*)();

}  // namespace binding

}  // namespace opforge

// The entry behind an op's Python function (a function of opforge._C.ops or of an op module, as
// def_op makes them: not its meta rule nor its in-place variant), or null when fn is not one: how
// code outside the Python face reaches an op without running Python per call (opforge.torch's
// native kernels). fn is a PyObject*, declared void* to keep Python's headers out of this one.
extern "C" __attribute__((visibility("default"))) const opforge::binding::OpEntry* opforge_op_entry(void* fn);
