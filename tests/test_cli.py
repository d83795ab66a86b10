"""The `opforge` command line (installed console script and `python -m opforge`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import opforge
from conftest import SPEC_DIR


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opforge", *args], capture_output=True, text=True)


def test_check_installed_and_source_specs() -> None:
    r = run("check")
    assert r.returncode == 0 and r.stdout.strip().endswith("op specs OK"), r.stderr
    r = run("check", str(SPEC_DIR), "--kernel-root", str(SPEC_DIR.parent))
    assert r.returncode == 0, r.stderr


def test_check_reports_mistakes_and_exits_non_zero(tmp_path: Path) -> None:
    # a checkout of opforge (its pyproject.toml names it) whose op_specs/ has mistakes
    specs = tmp_path / "op_specs"
    shutil.copytree(SPEC_DIR, specs)
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "opforge"\n')
    text = (specs / "relu.yaml").read_text().replace("zeros_like(dout), dout)", "zeros_like(dout), dotu)")
    (specs / "relu.yaml").write_text(text)
    (specs / "bad.yaml").write_text("bad:\n  doc: x\n  inputs: {x: T}\n")
    r = subprocess.run([sys.executable, "-m", "opforge", "check", str(specs)], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "op_specs/bad.yaml:2:3: missing required key 'impl'",
        "op_specs/bad.yaml:2:3: missing required key 'outputs'",
        "op_specs/relu.yaml:19:40: bprop.x: unknown name 'dotu' (did you mean 'dout'?)",
        "3 errors",
    ]
    # the same specs outside a checkout of opforge are another project's, taking opforge's names
    (tmp_path / "pyproject.toml").write_text("[project\nname = 'opforge'\n")
    r = run("check", str(specs / "exp.yaml"))
    assert r.returncode == 2 and "pyproject.toml: cannot read the project's name:" in r.stderr, r.stderr
    (tmp_path / "pyproject.toml").unlink()
    r = run("check", str(specs / "exp.yaml"))
    assert r.returncode == 1 and "exp.yaml:1:1: exp: 'exp' is already an op of opforge" in r.stderr, r.stderr


def test_check_bad_path_and_usage(tmp_path: Path) -> None:
    r = run("check", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "no such file or directory" in r.stderr
    r = run("frobnicate")
    assert r.returncode == 2 and "invalid choice" in r.stderr
    assert run("check", "--help").returncode == 0


def test_every_command_has_help() -> None:
    for cmd in ("check", "new", "list", "info", "gen", "docs", "build", "init", "config"):
        r = run(cmd, "--help")
        assert r.returncode == 0 and "Exit status: 0 success" in r.stdout, cmd


def test_list_prints_every_op() -> None:
    r = run("list", "--specs", str(SPEC_DIR))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert [line.split()[0] for line in lines] == sorted(p.stem for p in SPEC_DIR.glob("*.yaml"))
    assert any(line.split()[:2] == ["layer_norm", "cpp"] and "(x, weight?, bias?) -> (y, mean, rstd)" in line
               for line in lines)


def test_info_prints_the_registration_table() -> None:
    r = run("info", "leaky_relu_ext", "--specs", str(SPEC_DIR))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert out.startswith("leaky_relu_ext(x: TensorLike, *, out: Tensor | None = None) -> Tensor")
    assert "Impl: aot (function leaky_relu_ext of libleaky_relu_ext.so)" in out
    assert "Differentiable inputs: x" in out
    assert "    cpu   DefaultFormat x=float64 out=float64" in out
    assert "dx = where(x > 0, dout, 0.01 * dout)" in out
    r = run("info", "cross_entropy")
    assert "labels (int64, not differentiable)" in r.stdout and "Differentiable inputs: logits" in r.stdout


def test_info_unknown_op_and_bad_path(tmp_path: Path) -> None:
    r = run("info", "leaky_rlu")
    assert r.returncode == 2
    assert "opforge info: unknown op 'leaky_rlu' (did you mean 'leaky_relu'?)" in r.stderr
    r = run("list", "--specs", str(tmp_path / "nope"))
    assert r.returncode == 2 and "nope: no such file or directory" in r.stderr


def test_gen_writes_what_the_build_generates(tmp_path: Path) -> None:
    r = run("gen", "--specs", str(SPEC_DIR), "--backend", "cpu", "--out", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    n = len(list((tmp_path / "a").iterdir()))
    assert f"{n} files for" in r.stdout and f"({n} written, 0 unchanged)" in r.stdout
    r = run("gen", "--specs", str(SPEC_DIR), "--out", str(tmp_path / "a"))
    assert f"(0 written, {n} unchanged)" in r.stdout
    # the same bytes as the build's own codegen step
    subprocess.run([sys.executable, str(SPEC_DIR.parent / "tools" / "codegen.py"), "generate", "--specs",
                    str(SPEC_DIR), "--out", str(tmp_path / "b")], check=True)
    for f in (tmp_path / "b").iterdir():
        assert (tmp_path / "a" / f.name).read_bytes() == f.read_bytes(), f.name


def test_gen_errors(tmp_path: Path) -> None:
    # every wheel backend generates (the cu130 wheel's op table lists its targets)
    r = run("gen", "--specs", str(SPEC_DIR), "--backend", "cuda", "--out", str(tmp_path / "cuda"))
    assert r.returncode == 0, r.stderr
    assert "BUILT_TARGETS = ('cpu', 'cuda',)" in (tmp_path / "cuda" / "_formulas.py").read_text()
    r = run("gen", "--specs", str(SPEC_DIR), "--backend", "tpu", "--out", str(tmp_path))
    assert r.returncode == 2 and "invalid choice: 'tpu'" in r.stderr
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "bad.yaml").write_text("bad:\n  doc: x\n  inputs: {x: T}\n")
    r = run("gen", "--specs", str(tmp_path / "specs"), "--out", str(tmp_path / "out"))
    assert r.returncode == 1 and "bad.yaml:2:3: missing required key 'impl'" in r.stderr
    assert not (tmp_path / "out").exists()  # nothing written for invalid specs


def test_docs_pages_and_their_examples_run(tmp_path: Path) -> None:
    r = run("docs", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr
    pages = sorted(p for p in tmp_path.glob("*.md") if p.name != "index.md")
    assert [p.stem for p in pages] == sorted(p.stem for p in SPEC_DIR.glob("*.yaml"))
    index = (tmp_path / "index.md").read_text()
    assert "| [`leaky_relu`](leaky_relu.md) | expr |" in index
    page = (tmp_path / "leaky_relu.md").read_text()
    assert "leaky_relu(x: TensorLike, alpha: float = 0.01, *, out: Tensor | None = None) -> Tensor" in page
    assert "| `alpha` | float | `0.01` |" in page and "dx = where(x > 0, dout, dout * alpha)" in page
    assert "Gradients (derived from impl.expr):" in page and "out_t = where(x > 0, x_t, x_t * alpha)" in page
    assert "- **cpu**: T: float16, bfloat16, float32, float64" in page
    # every page's example runs
    code = []
    for p in pages:
        example = p.read_text().split("## Example\n\n```python\n")[1].split("```")[0]
        code.append(f"def example_{p.stem}():\n" + "".join(f"    {line}\n" for line in example.splitlines())
                    + f"example_{p.stem}()\n")
    r = subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]


def _project_copy(dst: Path) -> Path:
    """A copy of this source tree (no build directory, no git metadata) to add ops to."""
    # (nor nox's session environments, gigabytes of frameworks, when the test command runs in them)
    ignore = shutil.ignore_patterns("build", ".git", ".nox", "__pycache__", "rank_0", "*.egg-info", ".pytest_cache",
                                    ".mypy_cache")
    shutil.copytree(SPEC_DIR.parent, dst, ignore=ignore)
    return dst


def test_new_writes_specs_that_check(tmp_path: Path) -> None:
    specs = tmp_path / "op_specs"
    for kind in ("expr", "composite", "cpp", "pyfunc"):
        r = subprocess.run([sys.executable, "-m", "opforge", "new", f"my_{kind}", "--kind", kind, "--dir", "op_specs"],
                           capture_output=True, text=True, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        assert f"wrote op_specs/my_{kind}.yaml" in r.stdout and "next: opforge check op_specs" in r.stdout
    kernel = tmp_path / "src" / "kernels" / "cpu" / "my_cpp.cpp"
    assert "void my_cpp(const TensorPtr& x, const TensorPtr& out, const MyCppAttrs& attrs)" in kernel.read_text()
    assert "def my_pyfunc(x: np.ndarray, *, beta: float) -> np.ndarray:" in (tmp_path / "my_pyfunc_impl.py").read_text()
    # their formulas call opforge's ops (mul, add, where, ...): the command `new` prints next knows them
    r = subprocess.run([sys.executable, "-m", "opforge", "check", "op_specs", "--kernel-root", "."],
                       capture_output=True, text=True, cwd=tmp_path)
    assert (r.returncode, r.stdout.strip()) == (0, "4 op specs OK"), r.stderr
    r = run("info", "my_expr", "--specs", str(specs))
    assert r.returncode == 0 and "dx = where(x > 0, alpha * dout, dout)" in r.stdout, r.stderr
    # as do opforge's own specs, checked as they are now (with or without the new ones)
    r = run("check", str(specs), str(SPEC_DIR))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"{len(list(SPEC_DIR.glob('*.yaml'))) + 4} op specs OK"
    r = run("check", str(SPEC_DIR / "softmax.yaml"))
    assert (r.returncode, r.stdout.strip()) == (0, "1 op spec OK"), r.stderr
    # a spec of another project cannot take the name of one of opforge's ops
    (tmp_path / "mine").mkdir()
    shutil.copy(SPEC_DIR / "mul.yaml", tmp_path / "mine" / "mul.yaml")
    r = run("check", str(tmp_path / "mine"))
    assert r.returncode == 1 and "mul.yaml:2:1: mul: 'mul' is already an op of opforge" in r.stderr, r.stderr
    # nor generate one of their classes (_mul's class is Mul: the two headers meet in one TU)
    (tmp_path / "mine" / "mul.yaml").rename(tmp_path / "mine" / "_mul.yaml")
    (tmp_path / "mine" / "_mul.yaml").write_text((tmp_path / "mine" / "_mul.yaml").read_text().replace("mul:", "_mul:", 1))
    r = run("check", str(tmp_path / "mine"))
    assert r.returncode == 1 and "_mul: generates C++ name Mul, as opforge's op 'mul' does" in r.stderr, r.stderr
    (tmp_path / "mine" / "_mul.yaml").write_text((tmp_path / "mine" / "_mul.yaml").read_text().replace("_mul:", "mul_expr:", 1))
    (tmp_path / "mine" / "_mul.yaml").rename(tmp_path / "mine" / "mul_expr.yaml")
    r = run("check", str(tmp_path / "mine"))
    assert r.returncode == 1 and "mul_expr: generates C++ name MulExpr, as opforge's op 'mul' does" in r.stderr, r.stderr
    before = (specs / "my_expr.yaml").read_text()
    r = subprocess.run([sys.executable, "-m", "opforge", "new", "my_expr", "--dir", "op_specs"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "my_expr.yaml already exists; nothing written" in r.stderr
    assert (specs / "my_expr.yaml").read_text() == before
    r = run("new", "Bad-Name", "--dir", str(specs))
    assert r.returncode == 2 and "'Bad-Name' is not an op name" in r.stderr
    r = run("new", "x", "--kind", "fortran")
    assert r.returncode == 2 and "invalid choice: 'fortran'" in r.stderr
    # a name the checker would refuse writes nothing (the spec is checked in a scratch folder first)
    for name, why in [("add", "'add' is already an op of opforge"), ("lambda", "'lambda' is a reserved word"),
                      ("tensor", "would generate class Tensor"), ("_1", "an op name needs a letter before any digit"),
                      ("a__b", "is reserved for the C++ implementation")]:
        r = run("new", name, "--dir", str(specs))
        assert r.returncode == 2 and f"'{name}' cannot name an op: " in r.stderr and why in r.stderr, r.stderr
        assert not (specs / f"{name}.yaml").exists()
    afile = tmp_path / "a_file"
    afile.write_text("")
    r = run("new", "zed", "--dir", str(afile))
    assert r.returncode == 2 and f"{afile} is a file, not a folder; nothing written" in r.stderr, r.stderr
    r = run("docs", "--specs", str(specs), "--out", str(afile / "docs"))
    assert r.returncode == 2 and f"--out {afile / 'docs'}: " in r.stderr and "give a folder" in r.stderr, r.stderr


def _with_called_ops(specs: Path, roots: list[str]) -> set[str]:
    """roots and every op their formulas call, transitively."""
    from opforge.codegen.load import called_ops, load_specs
    known = {s.name: s for s in load_specs(sorted(specs.glob("*.yaml")))}
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += sorted(called_ops(known[name]) & known.keys())
    return seen


@pytest.mark.slow
def test_new_ops_build_and_pass_their_generated_tests(tmp_path: Path) -> None:
    """The scaffolded specs, as written, build into the package and pass the spec-driven tests."""
    project = _project_copy(tmp_path / "project")
    kinds = ("expr", "composite", "cpp", "pyfunc")
    for kind in kinds:
        r = subprocess.run([sys.executable, "-m", "opforge", "new", f"scaffold_{kind}", "--kind", kind],
                           capture_output=True, text=True, cwd=project)
        assert r.returncode == 0, r.stderr
    # built with the ops they call and those opforge's Tensor needs, not every op of the project
    # (a full build is minutes of CI): a scaffold that calls an op outside them fails to build
    keep = _with_called_ops(project / "op_specs", [f"scaffold_{k}" for k in kinds] + sorted(opforge._TENSOR_OPS))
    for spec in (project / "op_specs").glob("*.yaml"):
        if spec.stem not in keep:
            spec.unlink()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    # the spec-driven tests (the other files of tests/ops name ops of the full set)
    r = subprocess.run(["bash", "tools/dev.sh", "pytest", "-v", "-n", "0", "-k", "scaffold_", "tests/ops/test_ops.py",
                        "tests/ops/test_formulas_py.py", "tests/ops/test_forward_mode.py"],
                       capture_output=True, text=True, cwd=project, env=env, timeout=1800)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    passed = [line for line in r.stdout.splitlines() if line.endswith("PASSED") or " PASSED " in line]
    # forward, gradient, forward-mode and bad-input cases of each of the four ops
    for kind in kinds:
        assert sum(f"scaffold_{kind}" in line for line in passed) >= 10, (kind, r.stdout[-3000:])
    assert len(passed) >= 80, r.stdout[-2000:]


def test_config_prints_flags() -> None:
    r = run("config", "--cflags")
    assert r.returncode == 0, r.stderr
    flags = r.stdout.splitlines()
    assert "-std=c++17" in flags and any(f.endswith("/include") and f.startswith("-I") for f in flags)
    both = run("config", "--cflags", "--ldflags").stdout.splitlines()
    assert "ldflag -l:libopforge.so" in both and "cflag -std=c++17" in both
    # op modules link this opforge: the other wheel backend is refused, naming both wheels
    other = "cuda" if opforge.backend == "cpu" else "cpu"
    r = run("config", "--backend", other)
    assert r.returncode == 2 and f"backend {other}: this opforge is the {opforge.backend} wheel" in r.stderr


def test_init_errors(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    r = run("init", str(tmp_path / "full"), "--name", "pkg")
    assert r.returncode == 2 and "exists and is not an empty directory; nothing written" in r.stderr
    r = run("init", str(tmp_path / "p"), "--name", "My-Pkg")
    assert r.returncode == 2 and "'My-Pkg' is not a package name" in r.stderr
    # names whose package would not import or would shadow opforge, a path meson cannot build in
    r = run("init", str(tmp_path / "p"), "--name", "class")
    assert r.returncode == 2 and "'class' is not a package name: it is a Python keyword" in r.stderr
    r = run("init", str(tmp_path / "p"), "--name", "opforge")
    assert r.returncode == 2 and "'opforge' is not a package name: it is opforge's own" in r.stderr
    for taken in ("mindspore", "torch", "numpy", "jax", "json"):  # (installing it would replace the framework)
        r = run("init", str(tmp_path / "p"), "--name", taken)
        assert r.returncode == 2 and f"'{taken}' is already the name of a Python package" in r.stderr, r.stderr
    odd = tmp_path / "p\nq"
    r = run("init", str(odd), "--name", "pk")
    assert r.returncode == 2 and f"{str(odd)!r}: a project path cannot hold a line break; nothing written" in r.stderr
    assert not (tmp_path / "p").exists() and not odd.exists()


def test_build_errors(tmp_path: Path) -> None:
    r = run("build", "--specs", str(tmp_path / "nope"), "--backend", "cpu")
    assert r.returncode == 2 and "no such file or directory" in r.stderr
    (tmp_path / "op_specs").mkdir()
    r = run("build", "--specs", str(tmp_path / "op_specs"), "--backend", "cpu")
    assert r.returncode == 2 and "pyproject.toml: no such file" in r.stderr
    r = run("build", "--specs", str(tmp_path / "op_specs"))
    assert r.returncode == 2 and "--backend" in r.stderr
    # a spec mistake is reported before anything is compiled
    assert run("init", str(tmp_path / "pk"), "--name", "pk").returncode == 0
    spec = tmp_path / "pk" / "op_specs" / "pk_half_square.yaml"
    spec.write_text(spec.read_text().replace("dout * x", "dout * y"))
    r = subprocess.run([sys.executable, "-m", "opforge", "build", "--specs", "op_specs", "--backend", opforge.backend],
                       capture_output=True, text=True, cwd=tmp_path / "pk")
    assert r.returncode == 1
    assert r.stderr.splitlines() == ["op_specs/pk_half_square.yaml:13:15: bprop.x: unknown name 'y'", "1 error"]
    assert not (tmp_path / "pk" / "dist").exists()


@pytest.mark.slow
def test_init_package_builds_installs_and_passes_its_tests(tmp_path: Path) -> None:
    # (in a directory whose name means something to a shell or a glob: the build must not care)
    project = tmp_path / "odd [1] $x it's" / "mypkg"
    r = run("init", str(project), "--name", "mypkg")
    assert r.returncode == 0, r.stderr
    # one more op with a hand-written kernel, as `opforge new` writes it
    r = subprocess.run([sys.executable, "-m", "opforge", "new", "mypkg_cube", "--kind", "cpp", "--dir", "op_specs"],
                       capture_output=True, text=True, cwd=project)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "opforge", "build", "--specs", "op_specs", "--backend", opforge.backend,
                        "--out", str(tmp_path / "dist")], capture_output=True, text=True, cwd=project, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "] Linking target _ops" in r.stdout  # the compiler's progress was shown
    wheels = list((tmp_path / "dist").glob("mypkg-0.1.0-*.whl"))
    assert len(wheels) == 1, r.stdout
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheels[0])],
                   check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], capture_output=True,
                       text=True, cwd=project, env=env)
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout + r.stderr
    code = ("import numpy as np, opforge, mypkg; x = opforge.tensor(np.array([2.0]), requires_grad=True); "
            "y = opforge.ops.mul(mypkg.ops.mypkg_half_square(x), mypkg.ops.mypkg_cube(x)); y.backward(); "
            "print(sorted(mypkg.ops.__all__), opforge.op_info('mypkg_cube')[0]['op_name'], y.item(), x.grad.item())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    names, info, value, grad = r.stdout.rsplit(" ", 3)
    assert names == "['mypkg_cube', 'mypkg_half_square']" and info == "mypkg_cube"
    assert (float(value), float(grad)) == (4.0, 6.0)  # 0.5 x^2 * x at 2, and its derivative 1.5 x^2
    assert (site / "mypkg" / "ops.pyi").read_text().count("def mypkg_half_square(") == 1
    # its op table, which opforge.torch.register_module(mypkg._ops) reads
    r = subprocess.run([sys.executable, "-c", "import mypkg; t = mypkg._ops.__opforge_formulas__; "
                        "print(sorted(t), t['mypkg_half_square'].bprop is not None)"],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.stdout.split("] ") == ["['mypkg_cube', 'mypkg_half_square'", "True\n"], r.stderr
    # in MindSpore: the package's own AOT entry points, bprops from its formulas
    code = ("import numpy as np, mindspore as ms, opforge.mindspore as om, mypkg; s = om.register_module(mypkg._ops); "
            "x = ms.Tensor(np.array([2.0])); print(s.primitive('mypkg_cube', scale=3.0)(x).asnumpy()[0], "
            "ms.grad(lambda t: s.ops.mypkg_half_square(t))(x).asnumpy()[0], s.primitive('mypkg_cube').func.split(':')[0])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    cube, grad, library = r.stdout.split()
    assert (float(cube), float(grad)) == (6.0, 2.0) and Path(library).parent == site / "mypkg", r.stdout
