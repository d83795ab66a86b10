"""The seed documents' MindSpore examples with opforge ops, in PyNative and Graph mode.

    pip install mindspore==2.10.0 "numpy<2"   # MindSpore 2.10 needs NumPy 1.x
    python examples/mindspore_seeds.py

- seed 000: MyNet, mul(mul(x, y), p) with value_and_grad over inputs and the Parameter
  (out 12.0, grads (6, 4) and (6,));
- seeds 002/003: square's gradient (x = [1, 4, 9] gives dx = [2, 8, 18]);
- seed 004: LeakyRelu on [[0, -0.1], [-0.2, 1]], once with opforge's own kernel and once with
  the aot op leaky_relu_ext, whose kernel is a function of an external library.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import mindspore as ms  # noqa: E402
import numpy as np  # noqa: E402
from mindspore import Parameter, Tensor, nn  # noqa: E402

import opforge.mindspore as om  # noqa: E402


class MyNet(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.p = Parameter(2.0, requires_grad=True)
        self.my_ops = om.ops

    def construct(self, x: Tensor, y: Tensor) -> Tensor:
        z = self.my_ops.mul(x, y)
        return self.my_ops.mul(z, self.p)


class SquareNet(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.square = om.ops.square

    def construct(self, x: Tensor) -> Tensor:
        return self.square(x)


class LeakyReluNet(nn.Cell):
    def __init__(self, op: str) -> None:
        super().__init__()
        self.leaky_relu = getattr(om.ops, op)

    def construct(self, x: Tensor) -> Tensor:
        return self.leaky_relu(x)


def main() -> None:
    ms.set_device(device_target="CPU")
    ms.runtime.launch_blocking()
    for mode, label in ((ms.PYNATIVE_MODE, "PYNATIVE_MODE"), (ms.GRAPH_MODE, "GRAPH_MODE")):
        ms.set_context(mode=mode)
        print(f"== {label}")
        net = MyNet()
        out, grads = ms.value_and_grad(net, grad_position=(0, 1), weights=net.trainable_params())(
            Tensor(1.0, ms.float32) * 2, Tensor(1.0, ms.float32) * 3)
        print("seed 000  out:", out, " grads[0]:", [float(g.asnumpy()) for g in grads[0]],
              " grads[1]:", [float(g.asnumpy()) for g in grads[1]])
        dx = ms.grad(SquareNet())(Tensor(np.array([1.0, 4.0, 9.0], np.float32)))
        print("seed 002  square dx:", dx)
        x0 = Tensor(np.array([[0.0, -0.1], [-0.2, 1.0]], np.float32))
        for op in ("leaky_relu", "leaky_relu_ext"):
            print(f"seed 004  {op}:", LeakyReluNet(op)(x0).asnumpy().astype(np.float64).round(6).tolist())
    print("leaky_relu_ext's kernel:", om.ops.leaky_relu_ext.func)


if __name__ == "__main__":
    main()
