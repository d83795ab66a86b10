"""The `opforge` command line (installed console script and `python -m opforge`)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import SPEC_DIR


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opforge", *args], capture_output=True, text=True)


def test_check_installed_and_source_specs() -> None:
    r = run("check")
    assert r.returncode == 0 and r.stdout.strip().endswith("op specs OK"), r.stderr
    r = run("check", str(SPEC_DIR), "--kernel-root", str(SPEC_DIR.parent))
    assert r.returncode == 0, r.stderr


def test_check_reports_mistakes_and_exits_non_zero(tmp_path: Path) -> None:
    shutil.copytree(SPEC_DIR, tmp_path, dirs_exist_ok=True)
    text = (tmp_path / "leaky_relu.yaml").read_text().replace("alpha * dout", "alhpa * dout")
    (tmp_path / "leaky_relu.yaml").write_text(text)
    (tmp_path / "bad.yaml").write_text("bad:\n  doc: x\n  inputs: {x: T}\n")
    r = subprocess.run([sys.executable, "-m", "opforge", "check", str(tmp_path)], capture_output=True,
                       text=True, cwd=tmp_path)
    assert r.returncode == 1
    assert r.stderr.splitlines() == [
        "bad.yaml:2:3: missing required key 'impl'",
        "bad.yaml:2:3: missing required key 'outputs'",
        "bad.yaml:2:3: missing required key 'targets'",
        "leaky_relu.yaml:18:27: bprop.x: unknown name 'alhpa' (did you mean 'alpha'?)",
        "4 errors",
    ]


def test_check_bad_path_and_usage(tmp_path: Path) -> None:
    r = run("check", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "no such file or directory" in r.stderr
    r = run("frobnicate")
    assert r.returncode == 2 and "invalid choice" in r.stderr
    assert run("check", "--help").returncode == 0


def test_every_command_has_help() -> None:
    for cmd in ("check", "list", "info", "gen", "docs"):
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
    assert out.startswith("leaky_relu_ext(x: TensorLike) -> Tensor")
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
    r = run("gen", "--specs", str(SPEC_DIR), "--backend", "cuda", "--out", str(tmp_path))
    assert r.returncode == 2 and "backend cuda is not available yet" in r.stderr
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
    assert "leaky_relu(x: TensorLike, alpha: float = 0.01) -> Tensor" in page
    assert "| `alpha` | float | `0.01` |" in page and "dx = where(x > 0, dout, alpha * dout)" in page
    assert "- **cpu**: T: float16, bfloat16, float32, float64" in page
    # every page's example runs
    code = []
    for p in pages:
        example = p.read_text().split("## Example\n\n```python\n")[1].split("```")[0]
        code.append(f"def example_{p.stem}():\n" + "".join(f"    {line}\n" for line in example.splitlines())
                    + f"example_{p.stem}()\n")
    r = subprocess.run([sys.executable, "-c", "\n".join(code)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
