"""opforge demo: an op generated from op_specs/leaky_relu.yaml, its registration info, its gradient."""

import numpy as np

import opforge
from opforge import ops

print(f"opforge backend: {opforge.backend}; {len(opforge.list_ops())} ops: {', '.join(opforge.list_ops())}\n")

# LeakyRelu, as a generated op (alpha is an attr of the spec).
x = np.array([[0.0, -0.1], [-0.2, 1.0]], np.float32)
print("leaky_relu(x) =\n", ops.leaky_relu(x).numpy(), "\n")

# The registration table row, shaped like MindSpore's CustomRegOp(...).get_op_info().
info = opforge.op_info("leaky_relu")[0]
print("op_info('leaky_relu')[0]:")
for key in ("op_name", "inputs", "outputs", "attr", "target"):
    print(f"  {key}: {info[key]}")
print(f"  dtype_format: {len(info['dtype_format'])} rows, e.g. {info['dtype_format'][6]}\n")

# The gradient comes from the spec's bprop formula: where(x > 0, dout, alpha * dout).
t = opforge.tensor(x, requires_grad=True)
ops.sum(ops.leaky_relu(t, alpha=0.2)).backward()
print("d/dx sum(leaky_relu(x, alpha=0.2)) =\n", t.grad.numpy(), "\n")

# Seed 000's network with MindSpore-style value_and_grad (inputs and a weight).
p = opforge.tensor(np.float32(2.0), requires_grad=True)
net = lambda a, b: ops.mul(ops.mul(a, b), p)  # noqa: E731
out, (g_inputs, g_weights) = opforge.value_and_grad(net, grad_position=(0, 1), weights=[p])(
    np.float32(2.0), np.float32(3.0))
print("seed 000: out =", out.item(), "grads[0] =", tuple(g.item() for g in g_inputs),
      "grads[1] =", tuple(g.item() for g in g_weights))

# Seed 002/003's square: dx = 2 * x.
print("seed 002: d/dx sum(square(x)) at [1, 4, 9] =",
      opforge.grad(lambda a: ops.sum(ops.square(a)))(np.array([1.0, 4.0, 9.0], np.float32)).numpy())
