"""opforge.optim against torch.optim: the same model, the same gradients, 20 steps, parameters
equal to float32 rounding (1e-6); the update is in place (same tensors, one version bump per
step) and the state is opforge tensors."""

from __future__ import annotations

import re

import numpy as np
import pytest

import opforge
from opforge import ops

torch = pytest.importorskip("torch", reason="torch is optional: the reference optimizers are torch.optim's")


def mlp_params(dtype: str) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.standard_normal(s).astype(dtype) * 0.3 for s in [(16, 8), (16,), (4, 16), (4,)]]


def loss_opforge(params, x, y):  # type: ignore[no-untyped-def]
    w1, b1, w2, b2 = params
    h = ops.gelu(ops.linear(x, w1, b1))
    return ops.mean(ops.square(ops.sub(ops.linear(h, w2, b2), y)))


def loss_torch(params, x, y):  # type: ignore[no-untyped-def]
    w1, b1, w2, b2 = params
    h = torch.nn.functional.gelu(torch.nn.functional.linear(x, w1, b1))
    return ((torch.nn.functional.linear(h, w2, b2) - y) ** 2).mean()


CONFIGS = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.05, "momentum": 0.9}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01, "dampening": 0.1}),
    ("SGD", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 0.001}),
    ("Adam", {"lr": 0.01}),
    ("Adam", {"lr": 0.01, "betas": (0.8, 0.99), "weight_decay": 0.01, "eps": 1e-6}),
    ("AdamW", {"lr": 0.01}),
    ("AdamW", {"lr": 0.02, "weight_decay": 0.1}),
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name,kwargs", CONFIGS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CONFIGS)])
def test_twenty_steps_match_torch_optim(name: str, kwargs: dict, dtype: str) -> None:
    rng = np.random.default_rng(5)
    init = mlp_params(dtype)
    ours = [opforge.tensor(a, requires_grad=True) for a in init]
    theirs = [torch.tensor(a, requires_grad=True) for a in init]
    opt = getattr(opforge.optim, name)(ours, **kwargs)
    ref = getattr(torch.optim, name)(theirs, **kwargs)
    tol = 1e-6 if dtype == "float32" else 1e-12
    for step in range(20):
        x = rng.standard_normal((8, 8)).astype(dtype)
        y = rng.standard_normal((8, 4)).astype(dtype)
        loss_opforge(ours, x, y).backward()
        loss_torch(theirs, torch.from_numpy(x), torch.from_numpy(y)).backward()
        # the same gradients on both sides, so only the optimizers are compared
        for p, q in zip(ours, theirs):
            q.grad = torch.from_numpy(p.grad.numpy().copy())
        before = [p._version for p in ours]
        opt.step()
        ref.step()
        opt.zero_grad()
        ref.zero_grad()
        assert [p._version for p in ours] == [v + 1 for v in before]
        for p, q in zip(ours, theirs):
            np.testing.assert_allclose(p.numpy(), q.detach().numpy(), rtol=tol, atol=tol, err_msg=f"step {step}")
    assert all(p.requires_grad and p.grad_fn is None for p in ours)


def test_the_step_updates_in_place_and_keeps_state_in_opforge_tensors() -> None:
    w = opforge.tensor(np.ones((3, 2), np.float32), requires_grad=True)
    opt = opforge.optim.Adam([w], lr=0.1)
    ops.sum(ops.square(w)).backward()
    opt.step()
    state = opt.state[0]
    assert state["step"] == 1 and isinstance(state["exp_avg"], opforge.Tensor)
    np.testing.assert_allclose(state["exp_avg"].numpy(), 0.2, rtol=1e-6)
    np.testing.assert_allclose(w.numpy(), 0.9, rtol=1e-6)            # Adam's first step moves by lr
    opt.zero_grad()
    assert w.grad is None
    opt.step()                                                         # no gradient: nothing moves
    np.testing.assert_allclose(w.numpy(), 0.9, rtol=1e-6)


def test_bad_arguments_name_the_optimizer() -> None:
    w = opforge.tensor(np.ones(3, np.float32), requires_grad=True)
    with pytest.raises(ValueError, match=re.escape("[SGD] lr must be a finite number >= 0, got -1")):
        opforge.optim.SGD([w], lr=-1)
    with pytest.raises(ValueError, match=re.escape("[SGD] nesterov needs momentum > 0 and dampening 0")):
        opforge.optim.SGD([w], nesterov=True)
    with pytest.raises(ValueError, match=re.escape("[Adam] betas must be two numbers in [0, 1)")):
        opforge.optim.Adam([w], betas=(0.9, 1.0))
    with pytest.raises(TypeError, match=re.escape("[AdamW] parameter 0 must be an opforge.Tensor, got ndarray")):
        opforge.optim.AdamW([np.ones(3)])
    with pytest.raises(TypeError, match=re.escape("[Adam] parameter 0 is int64")):
        opforge.optim.Adam([opforge.tensor(np.ones(3, np.int64))])
    with pytest.raises(ValueError, match=re.escape("[SGD] got an empty parameter list")):
        opforge.optim.SGD([])


def test_a_step_that_raises_leaves_parameters_and_state_as_they_were() -> None:
    ro = np.ones(3, np.float32)
    ro.flags.writeable = False
    frozen = opforge.from_numpy(ro)
    frozen.requires_grad = True
    for make in (lambda ps: opforge.optim.SGD(ps, lr=0.1, momentum=0.9, dampening=0.5),
                 lambda ps: opforge.optim.Adam(ps, lr=0.1)):
        w = opforge.tensor(np.ones(3, np.float32), requires_grad=True)
        opt = make([w, frozen])
        w.grad, frozen.grad = np.ones(3, np.float32), np.ones(3, np.float32)
        with pytest.raises(ValueError, match=r"out is read-only"):
            opt.step()
        assert opt.state == [{}, {}]
        np.testing.assert_array_equal(w.detach().numpy(), 1.0)
        frozen.grad = None
        opt.step()  # (the first step of w: torch's result, as if the failed one had not been)
        ref = make([opforge.tensor(np.ones(3, np.float32), requires_grad=True)])
        ref.params[0].grad = np.ones(3, np.float32)
        ref.step()
        np.testing.assert_array_equal(w.detach().numpy(), ref.params[0].detach().numpy())
        frozen.grad = None
    # a step of several groups (a parameter's first step beside another's second): all or nothing
    for make in (lambda ps: opforge.optim.SGD(ps, lr=0.1, momentum=0.9), lambda ps: opforge.optim.Adam(ps, lr=0.1)):
        w = opforge.tensor(np.ones(3, np.float32), requires_grad=True)
        opt = make([w, frozen])
        w.grad = np.ones(3, np.float32)
        opt.step()
        w_after, state_after = w.detach().numpy().copy(), {k: np.copy(v.numpy()) if isinstance(v, opforge.Tensor)
                                                              else v for k, v in opt.state[0].items()}
        frozen.grad = np.ones(3, np.float32)
        with pytest.raises(ValueError, match=r"out is read-only"):
            opt.step()
        np.testing.assert_array_equal(w.detach().numpy(), w_after)
        assert opt.state[1] == {}
        for k, v in opt.state[0].items():
            np.testing.assert_array_equal(v.numpy() if isinstance(v, opforge.Tensor) else v, state_after[k])
        frozen.grad = None
    adam = opforge.optim.Adam([opforge.tensor(np.ones(3, np.float32), requires_grad=True)])
    adam.params[0].grad = np.ones(3, np.float32)
    adam.defaults["lr"] = opforge.tensor(0.1)  # (a float64 tensor: the step's scalars of a float32 parameter too)
    with pytest.raises(TypeError, match=re.escape("[adam_step] inputs 'param' (float32) and 'step_size' (float64) "
                                                  "must have the same dtype")):
        adam.step()
    assert adam.state == [{}]


def test_hyperparameters_take_numpy_numbers_and_duplicates_warn() -> None:
    w = opforge.tensor(np.ones(3, np.float32), requires_grad=True)
    opt = opforge.optim.SGD([w], lr=np.float32(0.5))
    assert type(opt.defaults["lr"]) is float and opt.defaults["lr"] == 0.5
    # a schedule's lr written into the defaults later: a NumPy float64 beside float32 parameters
    for opt in (opforge.optim.SGD([w], lr=0.5), opforge.optim.AdamW([w], lr=0.5)):
        opt.defaults["lr"] = np.cos(0.0) * 0.25
        if "betas" in opt.defaults:  # (every per-step scalar computed from them, too)
            opt.defaults.update(betas=(np.float64(0.9), np.float64(0.999)), weight_decay=np.float64(0.01))
        w.grad = np.ones(3, np.float32)
        opt.step()
    assert w.dtype == "float32" and np.isfinite(w.detach().numpy()).all()
    with pytest.raises(TypeError, match=re.escape("[SGD] lr must be a number, got str")):
        opforge.optim.SGD([w], lr="0.1")
    with pytest.raises(TypeError, match=re.escape("[SGD] params must be an iterable of opforge Tensors, got a Tensor")):
        opforge.optim.SGD(w)
    with pytest.warns(UserWarning, match=re.escape("[Adam] a parameter is listed more than once")):
        opforge.optim.Adam([w, w])
