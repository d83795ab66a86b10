// Autograd: grad mode, graph nodes, AutogradContext, Function<T>::Apply and the backward engine.
#pragma once

#include <any>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/tensor.h"

namespace opforge {

// Thread-local switch: when off, Apply records nothing (opforge.no_grad()).
struct GradMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

struct GradModeGuard {
  explicit GradModeGuard(bool enabled) : prev_(GradMode::is_enabled()) { GradMode::set_enabled(enabled); }
  ~GradModeGuard() { GradMode::set_enabled(prev_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;
 private:
  bool prev_;
};

struct NoGradGuard : GradModeGuard {
  NoGradGuard() : GradModeGuard(false) {}
};

// Thread-local switch of forward-mode AD: when off, Apply ignores the tangents its inputs carry.
// Off while an op's jvp formula runs (it computes the tangent: tangents of the tangent would be
// second order, which one level of forward mode does not keep) and while backward runs.
struct FwGradMode {
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

struct FwGradModeGuard {
  explicit FwGradModeGuard(bool enabled) : prev_(FwGradMode::is_enabled()) { FwGradMode::set_enabled(enabled); }
  ~FwGradModeGuard() { FwGradMode::set_enabled(prev_); }
  FwGradModeGuard(const FwGradModeGuard&) = delete;
  FwGradModeGuard& operator=(const FwGradModeGuard&) = delete;
 private:
  bool prev_;
};

namespace detail {
// Drops a reference to a node of a graph being freed (a dying tensor's grad_fn, a dying node's
// next_edges). A node owns the nodes before it (its edges, and the grad_fn of each input it
// saved), so freeing the last tensor of a chain of n ops would nest n destructors and overflow
// the stack for long chains (a loss summed over 300,000 steps without detach, as in PyTorch's
// deleteNode). Instead the last reference goes to this thread's list, freed one node at a time
// by the outermost call; the nodes freed meanwhile only add to it.
void release_node(std::shared_ptr<Node>&& node) noexcept;
}  // namespace detail

struct TensorMeta {
  Shape shape;
  DType dtype;
  Device device;
};

// A step of the recorded graph: takes the gradients of its forward outputs, returns those of
// its forward inputs (nullptr where none), which flow along next_edges.
//
// Several threads may run backward over one graph at once (PyTorch allows it too): the engine
// holds mutex() while it applies or releases a node, so a thread never reads what another frees
// (and with retain_graph=False the second thread through a node gets a clean RuntimeError).
class Node : public std::enable_shared_from_this<Node> {
 public:
  virtual ~Node();  // (frees next_edges through detail::release_node)
  virtual TensorList apply(TensorList grads) = 0;
  virtual std::string name() const = 0;
  virtual void release() {}
  std::mutex& mutex() { return mutex_; }
  std::vector<Edge> next_edges;           // one per forward input
  std::vector<TensorMeta> output_meta;    // one per forward output (for zero-filling)

 private:
  std::mutex mutex_;
};

class AccumulateGrad : public Node {
 public:
  explicit AccumulateGrad(TensorPtr variable) : variable(std::move(variable)) {}
  TensorList apply(TensorList grads) override;
  std::string name() const override { return "AccumulateGrad"; }
  TensorPtr variable;
};

// What Forward may save, read back by Backward (the seeds' API).
class AutogradContext {
 public:
  // Whether t (an input of this call) requires grad.
  bool NeedGrad(const TensorPtr& t) const;
  // Whether input i needs a gradient (checked by Backward).
  bool NeedsInputGrad(size_t i) const { return i < needs_input_grad_.size() && needs_input_grad_[i]; }
  void SaveForBackward(TensorList tensors);
  TensorList GetSavedTensors() const;
  // Marks outputs that carry no gradient (indices, statistics).
  void MarkNonDifferentiable(const TensorList& outputs);

  template <typename A> void SaveAttrs(const A& attrs) { attrs_ = attrs; }
  // A copy of the saved attrs (nothing points into the context, which release() empties).
  // Forward saves them only when an input that needs a gradient uses them; a generated Backward
  // binds them whatever it computes but reads them only for such inputs, so when none were saved
  // it gets default attrs, which it does not read.
  template <typename A> A GetAttrs() const {
    if (released_) fail_released();
    const A* attrs = std::any_cast<A>(&attrs_);
    return attrs ? *attrs : A{};
  }

  // The op this context belongs to (for error messages).
  const char* op() const { return op_; }
  // Shape and dtype of input i at Forward time.
  const TensorMeta& input_meta(size_t i) const { return input_meta_[i]; }
  // Reduces a broadcast gradient to input i's shape and casts it to input i's dtype.
  TensorPtr ReduceGrad(size_t i, TensorPtr grad) const;

  // -- used by Function<T>::Apply and the node
  void init(const char* op, const TensorList& inputs, bool any_grad);
  void init_no_grad(const char* op) { op_ = op; }
  void finish(const TensorList& outputs, const std::shared_ptr<Node>& node);
  void release();
  bool is_non_differentiable(const TensorPtr& t) const;

 private:
  // RuntimeError: what was asked for was freed by release().
  [[noreturn]] void fail_released() const;
  struct Saved {
    TensorPtr tensor;         // inputs: as given; outputs: a detached alias
    int output_nr = -1;       // >= 0: an output of this node, re-attached on read
    uint64_t version = 0;     // the tensor's version when saved: another on read is an error
  };
  const char* op_ = "";       // a string literal (the op's kName)
  TensorList inputs_;         // only during Forward
  std::vector<bool> needs_input_grad_;
  std::vector<TensorMeta> input_meta_;
  TensorList to_save_;
  std::vector<Saved> saved_;
  TensorList non_differentiable_;
  std::weak_ptr<Node> node_;
  std::any attrs_;
  bool released_ = false;
  bool recording_ = false;
};

// The node recorded for a call of a Function<T>.
template <typename T>
class CppNode : public Node {
 public:
  TensorList apply(TensorList grads) override { return T::Backward(&ctx, std::move(grads)); }
  std::string name() const override { return ctx.op(); }
  void release() override { ctx.release(); }
  AutogradContext ctx;
};

namespace detail {
template <typename A>
bool requires_grad(const A& a) {
  if constexpr (std::is_convertible_v<const A&, const TensorPtr&>) {
    const TensorPtr& t = a;
    return t && t->requires_grad();
  } else {
    return false;
  }
}
inline void collect(TensorList&) {}
template <typename A, typename... Rest>
void collect(TensorList& out, const A& a, const Rest&... rest) {
  if constexpr (std::is_convertible_v<const A&, const TensorPtr&>) out.push_back(a);
  collect(out, rest...);
}
template <typename A>
bool has_tangent(const A& a) {
  if constexpr (std::is_convertible_v<const A&, const TensorPtr&>) {
    const TensorPtr& t = a;
    return t && t->fw_grad();
  } else {
    return false;
  }
}
inline void collect_tangents(TensorList&) {}
template <typename A, typename... Rest>
void collect_tangents(TensorList& out, const A& a, const Rest&... rest) {
  if constexpr (std::is_convertible_v<const A&, const TensorPtr&>) {
    const TensorPtr& t = a;
    out.push_back(t ? t->fw_grad() : nullptr);
  }
  collect_tangents(out, rest...);
}
template <typename T, typename = void>
struct has_jvp : std::false_type {};
template <typename T>
struct has_jvp<T, std::void_t<decltype(&T::Jvp)>> : std::true_type {};
// Sets each output's tangent from the op's jvp results: a broadcast of the output's shape is
// expanded, the dtype cast; another shape is the jvp formula's mistake (RuntimeError naming op).
void set_tangents(const char* op, const TensorList& outputs, const TensorList& tangents);
[[noreturn]] void fail_no_jvp(const char* op);
inline void as_list(TensorList& out, const TensorPtr& t) { out.push_back(t); }
inline void as_list(TensorList& out, const TensorList& ts) { out.insert(out.end(), ts.begin(), ts.end()); }
// An output that is one of the inputs becomes a fresh alias, so recording it never rewrites the
// history of the caller's tensor.
void unalias(TensorPtr& out, const TensorList& inputs);
inline void unalias(TensorList& outs, const TensorList& inputs) {
  for (auto& o : outs) unalias(o, inputs);
}
void record(const std::shared_ptr<Node>& node, AutogradContext& ctx, const TensorList& inputs,
            const TensorList& outputs);
}  // namespace detail

// CRTP base of generated (and hand-written) differentiable functions, as in the seeds:
//   class Mul : public Function<Mul> { static TensorPtr Forward(AutogradContext*, ...);
//                                      static TensorList Backward(AutogradContext*, TensorList); };
// T must define `static constexpr const char* kName`.
template <typename T>
struct Function {
  template <typename... Args>
  static auto Apply(const Args&... args) {
    CurrentOpScope running(T::kName);
    if ((detail::has_tangent(args) || ...) && FwGradMode::is_enabled()) return ApplyDual(args...);
    return ApplyPrimal(args...);
  }

  // The call as reverse mode sees it: Forward, recorded when an input requires grad.
  template <typename... Args>
  static auto ApplyPrimal(const Args&... args) {
    if (!GradMode::is_enabled() || !(detail::requires_grad(args) || ...)) {
      AutogradContext ctx;  // records nothing: no allocation on this path
      ctx.init_no_grad(T::kName);
      return T::Forward(&ctx, args...);
    }
    TensorList inputs;
    detail::collect(inputs, args...);
    auto node = std::make_shared<CppNode<T>>();
    node->ctx.init(T::kName, inputs, true);
    auto result = [&] {
      NoGradGuard no_grad;
      return T::Forward(&node->ctx, args...);
    }();
    detail::unalias(result, inputs);
    TensorList outputs;
    detail::as_list(outputs, result);
    detail::record(node, node->ctx, inputs, outputs);
    return result;
  }

  // A call with tangents (forward mode): the primal call as usual (recorded for backward when
  // its inputs require grad), then the op's jvp (T::Jvp, from its spec's jvp formulas) on the
  // primal values and the inputs' tangents (nullptr where an input has none), which the outputs
  // then carry. T::Jvp runs with grad mode as it is, so reverse mode sees it (grad of jvp).
  template <typename... Args>
  static auto ApplyDual(const Args&... args) {
    auto result = [&] {
      FwGradModeGuard primal(false);
      return ApplyPrimal(args...);
    }();
    TensorList outputs;
    detail::as_list(outputs, result);
    TensorList tangents;
    detail::collect_tangents(tangents, args...);
    if constexpr (detail::has_jvp<T>::value) {
      FwGradModeGuard tangent(false);
      detail::set_tangents(T::kName, outputs, T::Jvp(tangents, outputs, args...));
    } else {
      detail::fail_no_jvp(T::kName);
    }
    return result;
  }
};

// Runs backward from roots. With `inputs` given, returns their gradients instead of
// accumulating into .grad (opforge.grad); `allow_unused` lets an input get none (nullptr).
TensorList run_backward(const TensorList& roots, const TensorList& grad_roots, bool retain_graph,
                        bool create_graph, const TensorList& inputs = {}, bool allow_unused = true);

}  // namespace opforge
