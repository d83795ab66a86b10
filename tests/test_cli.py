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
