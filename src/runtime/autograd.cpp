// Autograd: AutogradContext bookkeeping, graph recording and the backward engine.
#include "runtime/autograd.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "runtime/functional.h"

namespace opforge {

namespace {
thread_local bool grad_mode_enabled = true;
thread_local bool fw_grad_mode_enabled = true;

// Where t's gradient goes: the output of the node that made it, or a leaf's accumulator. (Its
// history read once, as a pair: an in-place op may be replacing it on another thread.)
Edge gradient_edge(const TensorPtr& t) {
  if (Edge e = t->history(); e.fn) return e;
  return Edge{t->grad_accumulator(t), 0};
}
}  // namespace

bool GradMode::is_enabled() { return grad_mode_enabled; }
void GradMode::set_enabled(bool enabled) { grad_mode_enabled = enabled; }
bool FwGradMode::is_enabled() { return fw_grad_mode_enabled; }
void FwGradMode::set_enabled(bool enabled) { fw_grad_mode_enabled = enabled; }

// ---------------------------------------------------------------------------- freeing graphs

namespace {
// Tensors that a node's apply or release lets go of while backward holds the node's lock: freed
// after the lock (the memory of one may be a Python object whose release runs Python code, and
// that code may reach the same node: a finalizer running backward).
thread_local TensorList* t_free_later = nullptr;

// frees t at once, or after the node lock it is released under (t_free_later)
void free_later(TensorPtr&& t) {
  if (!t) return;
  if (t_free_later) {
    try {
      t_free_later->push_back(std::move(t));
      return;
    } catch (...) {  // (no memory for the list: freed now)
    }
  }
  t.reset();
}

struct Graveyard {
  std::vector<std::shared_ptr<Node>> pending;  // last references of nodes to free
  bool draining = false;                       // the outermost release_node is freeing them
};
thread_local Graveyard t_graveyard;
}  // namespace

namespace detail {

void release_node(std::shared_ptr<Node>&& node) noexcept {
  if (!node) return;
  // (another owner left: dropping this reference frees nothing; the count may fall meanwhile
  // on another thread, which then frees the node there, recursing at most as before)
  if (node.use_count() > 1) {
    node.reset();
    return;
  }
  Graveyard& g = t_graveyard;
  try {
    g.pending.push_back(std::move(node));
  } catch (...) {  // (no memory for the list: freed at once, recursively)
    node.reset();
    return;
  }
  if (g.draining) return;
  g.draining = true;
  while (!g.pending.empty()) {
    std::shared_ptr<Node> last = std::move(g.pending.back());
    g.pending.pop_back();
    last.reset();  // its destructor (and its tensors') add what it owned to pending
  }
  g.draining = false;
}

}  // namespace detail

Node::~Node() {
  for (Edge& e : next_edges) detail::release_node(std::move(e.fn));
}

// ---------------------------------------------------------------------------- context

void AutogradContext::init(const char* op, const TensorList& inputs, bool any_grad) {
  op_ = op;
  recording_ = any_grad;
  if (!any_grad) return;
  inputs_ = inputs;
  needs_input_grad_.resize(inputs.size());
  input_meta_.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& t = inputs[i];
    needs_input_grad_[i] = t && t->requires_grad();
    if (t) input_meta_[i] = TensorMeta{t->shape(), t->dtype(), t->device()};
  }
}

bool AutogradContext::NeedGrad(const TensorPtr& t) const {
  if (!recording_ || !t) return false;
  for (size_t i = 0; i < inputs_.size(); ++i) {
    if (inputs_[i].get() == t.get()) return needs_input_grad_[i];
  }
  return false;
}

void AutogradContext::SaveForBackward(TensorList tensors) {
  if (recording_) to_save_ = std::move(tensors);
}

void AutogradContext::MarkNonDifferentiable(const TensorList& outputs) {
  if (recording_) non_differentiable_.insert(non_differentiable_.end(), outputs.begin(), outputs.end());
}

bool AutogradContext::is_non_differentiable(const TensorPtr& t) const {
  return std::any_of(non_differentiable_.begin(), non_differentiable_.end(),
                     [&](const TensorPtr& u) { return u.get() == t.get(); });
}

void AutogradContext::finish(const TensorList& outputs, const std::shared_ptr<Node>& node) {
  node_ = node;
  saved_.clear();
  for (const auto& t : to_save_) {
    Saved s;
    if (t) {
      auto it = std::find_if(outputs.begin(), outputs.end(), [&](const TensorPtr& o) { return o.get() == t.get(); });
      if (it != outputs.end()) {
        // Saving our own output strongly would make a cycle node -> ctx -> output -> node.
        s.tensor = detach(t);
        s.output_nr = static_cast<int>(it - outputs.begin());
      } else {
        s.tensor = t;
      }
      s.version = t->version();
    }
    saved_.push_back(std::move(s));
  }
  to_save_.clear();
  inputs_.clear();
  non_differentiable_.clear();
}

void AutogradContext::fail_released() const {
  fail<RuntimeError>(op_, "trying to backward through the graph a second time (or to read saved tensors "
                          "after they were freed); pass retain_graph=True to the first backward");
}

TensorList AutogradContext::GetSavedTensors() const {
  if (released_) fail_released();
  TensorList out;
  out.reserve(saved_.size());
  auto node = node_.lock();
  for (size_t i = 0; i < saved_.size(); ++i) {
    const Saved& s = saved_[i];
    if (s.tensor && s.tensor->version() != s.version) {
      fail<RuntimeError>(op_, "saved tensor ", i, " (of shape ", shape_str(s.tensor->shape()), ") was modified in place "
                         "after ", op_, " used it: it is at version ", s.tensor->version(), ", saved at version ",
                         s.version, "; its gradient needs the old values (write into a copy, or run the in-place "
                         "op after backward)");
    }
    if (s.output_nr >= 0 && node) {
      auto t = detach(s.tensor);
      t->set_history(node, static_cast<uint32_t>(s.output_nr));
      out.push_back(std::move(t));
    } else {
      out.push_back(s.tensor);
    }
  }
  return out;
}

void AutogradContext::release() {
  for (Saved& v : saved_) free_later(std::move(v.tensor));
  saved_.clear();
  attrs_.reset();
  released_ = true;
}

TensorPtr AutogradContext::ReduceGrad(size_t i, TensorPtr grad) const {
  if (!grad) return grad;
  const TensorMeta& meta = input_meta_[i];
  if (grad->shape() != meta.shape) {
    // a bprop formula may return a broadcast gradient (reduced here), never one of another shape
    if (!broadcasts_to(meta.shape, grad->shape())) {
      fail<RuntimeError>(op_, "the gradient for input ", i, " has shape ", shape_str(grad->shape()),
                         ", which is not the input's shape ", shape_str(meta.shape), " nor a broadcast of it "
                         "(check the op's bprop formula)");
    }
    grad = sum_to(grad, meta.shape);
  }
  if (grad->dtype() != meta.dtype) grad = cast(grad, meta.dtype);
  return grad;
}

namespace detail {

void unalias(TensorPtr& out, const TensorList& inputs) {
  for (const auto& in : inputs) {
    if (in && in.get() == out.get()) {
      out = detach(out);
      return;
    }
  }
}

void set_tangents(const char* op, const TensorList& outputs, const TensorList& tangents) {
  for (size_t k = 0; k < outputs.size() && k < tangents.size(); ++k) {
    TensorPtr t = tangents[k];
    const TensorPtr& out = outputs[k];
    if (!t || !out || !is_floating(out->dtype())) continue;
    if (t->shape() != out->shape()) {
      if (!broadcasts_to(t->shape(), out->shape())) {
        fail<RuntimeError>(op, "the jvp for output ", k, " has shape ", shape_str(t->shape()),
                           ", which is not the output's shape ", shape_str(out->shape()),
                           " nor a broadcast of it (check the op's jvp formula)");
      }
      t = broadcast_to(t, out->shape());
    }
    if (t->dtype() != out->dtype()) t = cast(t, out->dtype());
    out->set_fw_grad(std::move(t));
  }
}

void fail_no_jvp(const char* op) {
  fail<RuntimeError>(op, "has no forward-mode derivative (jvp): its spec gives no jvp formula and none can be "
                         "derived; add a jvp section to the op's spec, or use reverse mode (grad, vjp)");
}

void record(const std::shared_ptr<Node>& node, AutogradContext& ctx, const TensorList& inputs,
            const TensorList& outputs) {
  node->next_edges.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const auto& t = inputs[i];
    if (!t || !t->requires_grad()) continue;
    node->next_edges[i] = gradient_edge(t);
  }
  node->output_meta.reserve(outputs.size());
  for (size_t k = 0; k < outputs.size(); ++k) {
    const auto& out = outputs[k];
    node->output_meta.push_back(TensorMeta{out->shape(), out->dtype(), out->device()});
    if (!ctx.is_non_differentiable(out) && is_floating(out->dtype())) {
      out->set_history(node, static_cast<uint32_t>(k));
    }
  }
  ctx.finish(outputs, node);
}

}  // namespace detail

// ---------------------------------------------------------------------------- engine

namespace {

// g itself when nothing else can see its memory, else a dense copy: .grad never shares memory
// with another tensor (another leaf's .grad, a caller's array, a broadcast view).
TensorPtr owned(TensorPtr g) {
  const bool exclusive = g.use_count() == 1 && g->storage().use_count() == 1 && !g->storage()->external;
  if (exclusive && g->is_contiguous()) return g;
  auto out = empty(g->dtype(), g->shape(), g->format(), g->device());
  copy_into(out, g);
  return out;
}

}  // namespace

TensorList AccumulateGrad::apply(TensorList grads) {
  TensorPtr g = grads.empty() ? nullptr : std::move(grads[0]);
  grads.clear();
  if (!g) return {};
  // Without create_graph the stored gradient has no history (and may be reused in place).
  if (!GradMode::is_enabled()) g = owned(g->is_leaf() ? std::move(g) : detach(g));
  TensorPtr previous;  // freed after the grad lock and backward's node lock are let go: freeing a
                       // NumPy array's memory takes the GIL, which a thread reading .grad holds
                       // while it waits for the lock, and may run Python code (free_later)
  {
    std::lock_guard<std::mutex> lock(variable->grad_mutex());
    TensorPtr& slot = variable->grad_unlocked();
    TensorPtr sum = slot ? add_grad(slot, g) : std::move(g);
    previous = std::exchange(slot, std::move(sum));
  }
  free_later(std::move(previous));
  return {};
}

namespace {

void accumulate(TensorList& buffer, uint32_t slot, const TensorPtr& g) {
  if (buffer.size() <= slot) buffer.resize(slot + 1);
  buffer[slot] = buffer[slot] ? add_grad(buffer[slot], g) : g;
}

}  // namespace

TensorList run_backward(const TensorList& roots, const TensorList& grad_roots, bool retain_graph,
                        bool create_graph, const TensorList& inputs, bool allow_unused) {
  GradModeGuard mode(create_graph);
  // reverse mode inside forward mode (a gradient of a function of dual tensors) would need the
  // tangents of every saved value: refused, rather than a gradient whose tangent is silently lost
  for (const auto& r : roots) {
    if (r && r->fw_grad() && FwGradMode::is_enabled()) {
      fail<RuntimeError>("backward", "a gradient inside forward mode (backward of a tensor carrying a tangent, "
                                     "e.g. grad inside jvp) is not supported; take the gradient of the jvp "
                                     "instead (reverse-over-forward)");
    }
  }
  FwGradModeGuard no_tangents(false);
  const bool capture_mode = !inputs.empty();
  std::map<std::pair<Node*, uint32_t>, std::vector<size_t>> capture;
  TensorList captured(inputs.size());
  std::vector<std::shared_ptr<Node>> keep_alive;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i]->requires_grad()) {
      fail<RuntimeError>("grad", "input ", i, " does not require grad");
    }
    Edge e = gradient_edge(inputs[i]);
    capture[{e.fn.get(), e.input_nr}].push_back(i);
    keep_alive.push_back(e.fn);
  }

  std::unordered_map<Node*, TensorList> buffers;
  std::vector<std::shared_ptr<Node>> root_nodes;
  for (size_t i = 0; i < roots.size(); ++i) {
    const auto& r = roots[i];
    if (!r->requires_grad()) {
      fail<RuntimeError>("backward", "element ", i, " of tensors does not require grad and does not have a grad_fn");
    }
    TensorPtr g = i < grad_roots.size() ? grad_roots[i] : nullptr;
    if (!g) {
      if (r->numel() != 1) {
        fail<RuntimeError>("backward", "grad can be implicitly created only for tensors with one element; "
                                       "pass grad= for a tensor of shape ", shape_str(r->shape()));
      }
      g = ones_like(r);
    } else if (g->shape() != r->shape()) {
      fail<ValueError>("backward", "grad has shape ", shape_str(g->shape()), " but the tensor has shape ",
                       shape_str(r->shape()));
    } else if (g->device() != r->device()) {
      fail<ValueError>("backward", "grad is on ", g->device().str(), " but the tensor is on ", r->device().str());
    } else if (g->dtype() != r->dtype()) {
      g = cast(g, r->dtype());
    }
    Edge e = gradient_edge(r);
    accumulate(buffers[e.fn.get()], e.input_nr, g);
    root_nodes.push_back(e.fn);
  }

  // Dependency counts: how many edges lead into each node from the part of the graph we run.
  std::unordered_map<Node*, int> deps;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (const auto& n : root_nodes) {
    if (seen.insert(n.get()).second) stack.push_back(n.get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const auto& e : n->next_edges) {
      if (!e.fn) continue;
      deps[e.fn.get()] += 1;
      if (seen.insert(e.fn.get()).second) stack.push_back(e.fn.get());
    }
  }

  std::vector<std::shared_ptr<Node>> ready;
  std::unordered_set<Node*> queued;
  for (const auto& n : root_nodes) {
    if (deps[n.get()] == 0 && queued.insert(n.get()).second) ready.push_back(n);
  }
  TensorList freed;  // what each node's apply or release lets go of, freed after its lock (free_later)
  while (!ready.empty()) {
    std::shared_ptr<Node> node = std::move(ready.back());
    ready.pop_back();
    TensorList grads = std::move(buffers[node.get()]);
    buffers.erase(node.get());
    grads.resize(std::max(grads.size(), std::max<size_t>(node->output_meta.size(), 1)));
    for (uint32_t k = 0; k < grads.size(); ++k) {
      auto it = capture.find({node.get(), k});
      if (it != capture.end() && grads[k]) {
        for (size_t idx : it->second) captured[idx] = grads[k];
      }
    }
    const bool any = std::any_of(grads.begin(), grads.end(), [](const TensorPtr& g) { return g != nullptr; });
    const bool is_leaf_acc = dynamic_cast<AccumulateGrad*>(node.get()) != nullptr;
    TensorList outs;
    const bool run = any && !(capture_mode && is_leaf_acc);
    if (run) {
      for (size_t k = 0; k < grads.size() && k < node->output_meta.size(); ++k) {
        if (!grads[k]) {
          const TensorMeta& m = node->output_meta[k];
          grads[k] = full(m.dtype, m.shape, 0.0, Format::Default, m.device);
        }
      }
    }
    {
      // another thread's backward may be applying or releasing this node too (see Node)
      std::lock_guard<std::mutex> lock(node->mutex());
      TensorList* outer = std::exchange(t_free_later, &freed);
      try {
        if (run) outs = node->apply(std::move(grads));
        if (!retain_graph) node->release();
      } catch (...) {
        t_free_later = outer;
        throw;
      }
      t_free_later = outer;
    }
    freed.clear();  // (after the lock; its capacity serves the next node)
    for (size_t k = 0; k < node->next_edges.size(); ++k) {
      const Edge& e = node->next_edges[k];
      if (!e.fn) continue;
      if (k < outs.size() && outs[k]) accumulate(buffers[e.fn.get()], e.input_nr, outs[k]);
      if (--deps[e.fn.get()] == 0) ready.push_back(e.fn);
    }
  }
  if (capture_mode && !allow_unused) {
    for (size_t i = 0; i < captured.size(); ++i) {
      if (!captured[i]) fail<RuntimeError>("grad", "input ", i, " was not used to compute the output");
    }
  }
  return captured;
}

}  // namespace opforge
