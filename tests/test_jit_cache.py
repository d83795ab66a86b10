"""opforge.load's cache as a trust boundary: paths that build.ninja and the shell must escape, a
cache that other users could write (refused), damaged entries and precompiled headers (removed
and built once more, never in a loop), and no pickle read from the cache. Builds compile C++
(seconds each): those tests are marked slow and run their loads in fresh processes."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import opforge
from opforge import jit
from opforge.codegen import SpecError
from test_jit import SCALE_ROWS, SCALE_ROWS_KERNEL, SOFTPLUS

SUFFIX = jit._native.extension_suffix()


def write_spec(d: Path, name: str = "sp_cache", bad: bool = False) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"{name}.yaml"
    text = SOFTPLUS.format(name=name, extra="")
    p.write_text(text.replace("log(1 + exp(x))", "log(1 + exq(x))") if bad else text)
    return p


def write_cpp_op(d: Path, name: str, body_extra: str = "", prelude: str = "") -> tuple[Path, Path]:
    """scale_rows of test_jit under another name (its kernel file in d), with more code in it."""
    camel = "".join(w.title() for w in name.split("_"))
    d.mkdir(parents=True, exist_ok=True)
    spec, kernel = d / f"{name}.yaml", d / f"{name}.cpp"
    spec.write_text(SCALE_ROWS.replace("scale_rows", name))
    text = SCALE_ROWS_KERNEL.replace("scale_rows", name).replace("ScaleRows", camel)
    text = text.replace("SCALE_ROWS", name.upper()).replace("px[i * cols + j] * pw[i];",
                                                            f"px[i * cols + j] * pw[i]{body_extra};")
    kernel.write_text(prelude + text)
    return spec, kernel


def load_in_process(name: str, spec: Path, root: Path, env: dict | None = None,
                    shared: Path | None = None) -> subprocess.CompletedProcess:
    """opforge.load in a fresh process (with shared as the installation's cache, if given); its
    stdout: 'built value' then one line per warning."""
    code = textwrap.dedent(f"""
        import pathlib, warnings, numpy as np, opforge
        from opforge import jit
        if {str(shared) if shared else None!r}:
            jit._installation_cache = lambda: pathlib.Path({str(shared)!r})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m = opforge.load({name!r}, specs=[{str(spec)!r}], build_dir={str(root)!r})
        print(m.__opforge_build__["built"], repr(m.{spec.stem}(np.array(0.0)).item()))
        for w in caught:
            print(w.category.__name__, w.message)
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)


def make_foreign(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """path as another user's: (its owner, this user). Only root can give a file away: other
    users become someone else instead (os.getuid, which the checks ask)."""
    if os.getuid() == 0:
        os.chown(path, 4242, -1)
        return 4242, 0
    me = os.getuid() + 1
    owner = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: me)
    return owner, me


LOG2 = repr(float(np.log(2.0)))


# ---------------------------------------------------------------------------- trust (no compiler)


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o1777], ids=oct)
def test_cache_root_that_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    root.chmod(mode)
    with pytest.raises(PermissionError, match=re.escape(
            f"[load] cache directory {root} is writable by other users (mode {mode:#o}): anyone who can write the "
            f"cache can run code in this process; make it private (chmod go-w {root}) or use another build_dir=")):
        opforge.load("m", specs=[write_spec(tmp_path)], build_dir=root)
    assert list(root.iterdir()) == []


def test_directories_below_the_root_are_checked_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cache"
    monkeypatch.setattr(jit, "_installation_cache", lambda: root)  # (what a read-only installation does)
    (root / "m").mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    (root / "m").chmod(0o770)
    with pytest.raises(PermissionError, match=re.escape(f"[load] cache directory {root / 'm'} is writable by other "
                                                        "users (mode 0o770)")):
        opforge.load("m", specs=[write_spec(tmp_path)], build_dir=root)
    # the precompiled header's directory (which the compiler reads) as well, before anything is compiled
    (root / "m").chmod(0o700)
    (root / "_pch").mkdir(mode=0o777)
    (root / "_pch").chmod(0o777)
    with pytest.raises(PermissionError, match=re.escape(f"[load] cache directory {root / '_pch'} is writable by "
                                                        "other users (mode 0o777)")):
        opforge.load("m", specs=[write_spec(tmp_path)], build_dir=root)
    assert not list(root.glob("m/build/obj/**/*.o")) and not list(root.glob("m/????????????????"))


def test_cache_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    owner, me = make_foreign(root, monkeypatch)
    with pytest.raises(PermissionError, match=re.escape(
            f"[load] cache directory {root} belongs to uid {owner}, not to this user (uid {me}): the cache must be "
            "your own; use another build_dir= (or $OPFORGE_CACHE_DIR)")):
        opforge.load("m", specs=[write_spec(tmp_path)], build_dir=root)


def test_lock_file_is_never_opened_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    (tmp_path / "cache" / "m").mkdir(parents=True, mode=0o700)
    (tmp_path / "cache").chmod(0o700)
    (tmp_path / "cache" / "m" / ".lock").symlink_to(victim)
    with pytest.raises(PermissionError, match=re.escape(f"[load] lock file {tmp_path / 'cache' / 'm' / '.lock'} is a "
                                                        "symbolic link; remove it")):
        opforge.load("m", specs=[write_spec(tmp_path)], build_dir=tmp_path / "cache")
    assert not victim.exists()


def test_new_cache_directories_are_private_whatever_the_umask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "a" / "cache"
    shared = tmp_path / "installation"
    monkeypatch.setattr(jit, "_installation_cache", lambda: shared)
    old = os.umask(0o002)
    try:
        with pytest.raises(SpecError):  # (after the module's directories and opforge's parsed specs are made)
            opforge.load("m", specs=[write_spec(tmp_path, bad=True)], build_dir=root)
    finally:
        os.umask(old)
    assert [stat.S_IMODE(d.stat().st_mode) for d in (root, root / "m")] == [0o700, 0o700]
    # what is written for every module (the precompiled header's text and manifest) is the owner's
    # to write only: a later load checks that and would refuse it
    written = [f for f in shared.rglob("*") if f.is_file()]
    assert written and all(stat.S_IMODE(f.stat().st_mode) & 0o022 == 0 for f in written), written


def test_no_pickle_from_the_cache_is_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """opforge's parsed specs used to be unpickled from <root>/_known/<digest>.pickle (the digest
    of the codegen and the specs, computed here as it was): writing the cache ran code."""
    root = tmp_path / "cache"
    monkeypatch.setattr(jit, "_installation_cache", lambda: root)
    h = hashlib.sha256(jit._codegen_digest().encode())
    for p in sorted((jit._native.PACKAGE_DIR / "op_specs").glob("*.yaml")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self) -> tuple:
            return (os.mkdir, (str(marker),))

    (root / "_known").mkdir(parents=True, mode=0o700)
    root.chmod(0o700)
    (root / "_known" / f"{h.hexdigest()[:16]}.pickle").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(SpecError, match=r"impl\.expr: .*exq"):  # (opforge's specs are known by then)
        opforge.load("m", specs=[write_spec(tmp_path, bad=True)], build_dir=root)
    assert not marker.exists()


CENTERED = """\
{name}:
  doc: x minus its mean over the last axis (a composite of opforge's ops).
  inputs:
    x: T
  outputs:
    out: {{dtype: T, shape: same(x)}}
  dtypes:
    T: [float32, float64]
  impl:
    composite: x - mean(x, {axis}=[-1], keepdims=true)
"""


def test_opforge_ops_are_known_from_the_op_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Formulas may call opforge's ops: load knows their signatures from the generated op table,
    parsing none of opforge's specs and keeping nothing of them in the cache."""
    from opforge import _formulas
    from opforge.codegen import api
    from opforge.codegen import load as spec_load

    assert ([api.record_signature(d) for d in _formulas.OPS.values()]
            == [api.signature(opforge.spec(n)) for n in _formulas.OPS])
    parsed: list[str] = []
    read = spec_load.read_spec_document
    monkeypatch.setattr(spec_load, "read_spec_document", lambda p: parsed.append(Path(p).name) or read(p))
    monkeypatch.setattr(jit, "_installation_cache", lambda: tmp_path / "shared")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "centered_bad.yaml").write_text(CENTERED.format(name="centered_bad", axis="axs"))
    with pytest.raises(SpecError, match=r"mean.*'axs'.*did you mean 'axis'"):
        opforge.load("centered_bad", specs=[tmp_path / "bad"], build_dir=tmp_path / "cache")
    (tmp_path / "centered.yaml").write_text(CENTERED.format(name="centered", axis="axis"))
    m = opforge.load("centered", specs=[tmp_path / "centered.yaml"], build_dir=tmp_path / "cache")
    x = np.random.default_rng(0).standard_normal((3, 4))
    np.testing.assert_allclose(m.centered(x).numpy(), x - x.mean(axis=-1, keepdims=True), atol=1e-12)
    assert parsed == ["centered_bad.yaml", "centered.yaml"]
    assert not list((tmp_path / "shared").glob("_known*")) and not list((tmp_path / "cache").glob("_known*"))


def test_installation_cache_is_used_only_when_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What every module shares (the precompiled header, opforge's parsed specs) is kept in the
    installation's cache when it passes the cache's checks; else (read-only, another user's,
    writable by others) in the cache root, and nothing is read from the installation's."""
    root, inst = tmp_path / "cache", tmp_path / "site" / "opforge" / "_jit_cache"
    monkeypatch.setattr(jit, "_installation_cache", lambda: inst)
    inst.parent.mkdir(parents=True)
    assert jit._shared_root(root) == inst and stat.S_IMODE(inst.stat().st_mode) == 0o700
    inst.chmod(0o777)
    assert jit._shared_root(root) == root
    inst.chmod(0o700)
    make_foreign(inst, monkeypatch)
    assert jit._shared_root(root) == root
    monkeypatch.undo()
    monkeypatch.setattr(jit, "_installation_cache", lambda: tmp_path / "a file" / "_jit_cache")
    (tmp_path / "a file").write_text("")  # (as a read-only installation: it cannot be made)
    assert jit._shared_root(root) == root


@pytest.mark.parametrize("where", ["build_dir", "sources"])
def test_path_with_a_line_break_is_refused(tmp_path: Path, where: str) -> None:
    odd = tmp_path / "line\nbreak"
    args: dict = {"specs": [write_spec(tmp_path)], "build_dir": tmp_path / "cache"}
    if where == "build_dir":
        args["build_dir"] = odd
        text = str(odd)
    else:
        odd.mkdir()
        (odd / "helper.h").write_text("")
        args["sources"] = [odd / "helper.h"]
        text = str(odd / "helper.h")
    with pytest.raises(ValueError, match=re.escape(f"[load] {text!r} holds a line break: it cannot go into "
                                                   "build.ninja (rename it)")):
        opforge.load("m", **args)
    assert not (tmp_path / "cache").exists() and (where == "sources" or not odd.exists())


def test_ninja_and_shell_escaping() -> None:
    assert jit._ninja_path("/a b/c:d/e$f/g|h") == "/a$ b/c$:d/e$$f/g${pipe}h"
    assert jit._ninja_text(jit._shell(["-I/x y/$(touch pwned)", "it's"])) == (
        "'-I/x y/$$(touch pwned)' 'it'\"'\"'s'")
    with pytest.raises(ValueError, match=re.escape("[load] 'a\\nb' holds a line break: it cannot go into "
                                                   "build.ninja")):
        jit._ninja_text("a\nb")


# ---------------------------------------------------------------------------- builds


@pytest.mark.slow
def test_hostile_cache_root_and_source_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A space, $, $(...), a quote, a colon and | in the cache root, and the same (but |, which
    the compiler's dependency files cannot say) in the sources' directory: the build runs no
    command from a path, the module works, a new process loads it from the cache and an edit
    recompiles only what changed."""
    root = tmp_path / "with space" / "d$x" / "$(touch pwned)" / "it's" / "c:o|n" / "cache"
    src = tmp_path / "src $(touch pwned) it's $x"
    spec, kernel = write_cpp_op(src, "hostile_rows")
    monkeypatch.chdir(tmp_path)
    m = opforge.load("jit_hostile", specs=[spec], sources=[kernel], build_dir=root)
    x, w = np.arange(6.0).reshape(2, 3), np.array([2.0, -1.0])
    np.testing.assert_array_equal(m.hostile_rows(x, w).numpy(), x * w[:, None])
    assert not list(tmp_path.rglob("pwned")) and not Path("pwned").exists()
    assert str(root) not in (root / "jit_hostile" / "build" / "build.ninja").read_text()
    code = (f"import opforge, numpy as np; m = opforge.load('jit_hostile', specs=[{str(spec)!r}], "
            f"sources=[{str(kernel)!r}], build_dir={str(root)!r}); "
            f"print(m.__opforge_build__['built'], m.hostile_rows(np.ones((1, 2)), np.array([3.0])).numpy().sum())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "6.0"]
    kernel.write_text(kernel.read_text().replace("* pw[i];", "* pw[i] * 2;"))
    info = opforge.load("jit_hostile", specs=[spec], sources=[kernel], build_dir=root).__opforge_build__
    assert info["built"] and info["compiled"] == [str(kernel.resolve())]
    assert not list(tmp_path.rglob("pwned"))


@pytest.mark.slow
def test_cache_roots_share_the_installation_precompiled_header(tmp_path: Path) -> None:
    """Precompiled once per installation (not per cache root), and used by every op TU, whatever
    the sources' include directories: gcc says nothing about an invalid .gch (-Winvalid-pch)."""
    inst = tmp_path / "installation cache"
    spec = write_spec(tmp_path / "specs", "sp_shared")
    rows, kernel = write_cpp_op(tmp_path / "kernels", "shared_rows")
    outputs = []
    for root, specs, sources in ((tmp_path / "a", [spec], []), (tmp_path / "b", [spec, rows], [kernel])):
        code = textwrap.dedent(f"""
            import pathlib, opforge
            from opforge import jit
            jit._installation_cache = lambda: pathlib.Path({str(inst)!r})
            m = opforge.load('jit_shared', specs={list(map(str, specs))!r}, sources={list(map(str, sources))!r},
                             build_dir={str(root)!r}, verbose=True)
            print(m.sp_shared(__import__('numpy').array(0.0)).item())
        """)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.splitlines()[-1] == LOG2, r.stdout + r.stderr
        outputs.append(r.stdout)
        assert not (root / "_pch").exists() and not (root / "_known").exists()
    assert ["precompiling the runtime header" in out for out in outputs] == [True, False]
    assert not any("pch" in line and "warning" in line for out in outputs for line in out.splitlines()), outputs
    (gch,) = inst.glob("_pch/*/opforge_module_pch.h.gch")
    assert jit._manifest_problem(gch.with_name("pch.json"), [gch.name]) is None
    assert stat.S_IMODE(inst.stat().st_mode) == 0o700


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A cache root holding module jit_cache (built by another process), and its spec."""
    d = tmp_path_factory.mktemp("jit-built")
    spec = write_spec(d / "specs")
    r = load_in_process("jit_cache", spec, d / "cache", shared=d / "cache")  # (its precompiled header in it)
    assert r.returncode == 0 and r.stdout.splitlines() == [f"True {LOG2}"], r.stderr
    return spec, d / "cache"


def copy_of(built: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path, Path]:
    """A copy of the built cache root (keys do not depend on where the root is): (spec, root, module)."""
    spec, root = built
    shutil.copytree(root, tmp_path / "cache", symlinks=True)
    (target,) = (tmp_path / "cache" / "jit_cache").glob(f"????????????????/jit_cache{SUFFIX}")
    return spec, tmp_path / "cache", target


def rewrite_manifest(target: Path) -> None:
    """The manifest made to agree with what the entry now holds (as a stale or forged one would)."""
    manifest = target.with_name("manifest.json")
    data = json.loads(manifest.read_text())
    for fname, info in data["files"].items():
        info.update(size=(target.parent / fname).stat().st_size,
                    sha256=hashlib.sha256((target.parent / fname).read_bytes()).hexdigest())
    manifest.write_text(json.dumps(data))


DAMAGE = {
    "empty module": (lambda t: t.write_bytes(b""), r"jit_cache{suffix} has 0 bytes, not \d+"),
    "truncated module": (lambda t: t.write_bytes(t.read_bytes()[: t.stat().st_size // 2]),
                         r"jit_cache{suffix} has \d+ bytes, not \d+"),
    "random bytes": (lambda t: t.write_bytes(os.urandom(t.stat().st_size)),
                     r"jit_cache{suffix}'s content changed \(its SHA-256 is not the manifest's\)"),
    "op table raises": (lambda t: t.with_name("jit_cache_formulas.py").write_text("raise RuntimeError('boom')\n"),
                        r"jit_cache_formulas\.py has 27 bytes, not \d+"),
    "no manifest": (lambda t: t.with_name("manifest.json").unlink(), r"its manifest\.json is missing"),
    "manifest agrees, import fails": (lambda t: (t.write_bytes(os.urandom(4096)), rewrite_manifest(t)),
                                      r"it does not import \(ImportError: .*\)"),
}


@pytest.mark.slow
@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_entry_is_removed_and_built_again(built: tuple[Path, Path], tmp_path: Path, damage: str) -> None:
    spec, root, target = copy_of(built, tmp_path)
    harm, reason = DAMAGE[damage]
    harm(target)
    r = load_in_process("jit_cache", spec, root)
    assert r.returncode == 0, r.stderr
    built_line, *warned = r.stdout.splitlines()
    assert built_line == f"True {LOG2}"
    (warning,) = warned
    assert re.fullmatch(re.escape(f"RuntimeWarning [opforge.load] {target.parent}: cache entry damaged (")
                        + reason.format(suffix=re.escape(SUFFIX))
                        + re.escape("): removed; building it again"), warning), warning
    # the entry built again is intact: the next process loads it, with no warning
    assert load_in_process("jit_cache", spec, root).stdout.splitlines() == [f"False {LOG2}"]
    assert [p.name for p in (root / "jit_cache").glob(".*")] == [".lock"]  # no leftovers beside the entries


@pytest.mark.slow
def test_two_processes_load_a_damaged_entry_at_once(built: tuple[Path, Path], tmp_path: Path) -> None:
    spec, root, target = copy_of(built, tmp_path)
    target.write_bytes(b"")
    code = textwrap.dedent(f"""
        import warnings, numpy as np, opforge
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            m = opforge.load('jit_cache', specs=[{str(spec)!r}], build_dir={str(root)!r})
        print(m.__opforge_build__['built'], m.sp_cache(np.array(0.0)).item(), len(caught))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    results = [p.communicate() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], results
    lines = sorted(out.split() for out, _ in results)
    # one rebuilt it (with the warning); the others waited for it, or found it rebuilt
    assert lines == [["False", LOG2, "0"], ["False", LOG2, "0"], ["True", LOG2, "1"]]


def preloaded_with(library: Path) -> str:
    """LD_PRELOAD with `library` added to what this process preloads (under the sanitizers: their
    runtime, which must stay first in every child that loads instrumented code)."""
    return " ".join(filter(None, [os.environ.get("LD_PRELOAD", ""), str(library)]))


@pytest.mark.slow
def test_module_that_never_imports_is_built_once_per_load(tmp_path: Path) -> None:
    """A module that imports only where a library is preloaded: cached by such a process, then
    loaded elsewhere, it is built once more, fails again and is removed: ImportError names it."""
    helper = tmp_path / "libhelper.so"
    (tmp_path / "helper.cpp").write_text('extern "C" double opforge_jit_test_helper() { return 1.0; }\n')
    subprocess.run(["c++", "-shared", "-fPIC", str(tmp_path / "helper.cpp"), "-o", str(helper)], check=True)
    spec, kernel = write_cpp_op(tmp_path / "specs", "needs_helper", body_extra=" * opforge_jit_test_helper()",
                                prelude='extern "C" double opforge_jit_test_helper();\n')
    root = tmp_path / "cache"
    code = (f"import opforge, numpy as np; m = opforge.load('jit_helper', specs=[{str(spec)!r}], "
            f"sources=[{str(kernel)!r}], build_dir={str(root)!r}); "
            f"print(m.__opforge_build__['built'], m.needs_helper(np.ones((1, 2)), np.array([3.0])).numpy().sum())")
    ok = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        env={**os.environ, "LD_PRELOAD": preloaded_with(helper)})
    assert ok.stdout.split() == ["True", "6.0"], ok.stderr
    (target,) = root.glob(f"jit_helper/????????????????/jit_helper{SUFFIX}")
    for how, warned in (("built again", True), ("built just now", False)):
        r = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True)
        assert r.returncode == 1 and r.stdout == ""
        last = r.stderr.strip().splitlines()[-1]
        assert re.fullmatch(re.escape(f"ImportError: [load] {target}: the module {how} does not import: ImportError: ")
                            + r".*undefined symbol: opforge_jit_test_helper", last), r.stderr
        assert (f"cache entry damaged (it does not import (ImportError: " in r.stderr) == warned
        assert not target.parent.exists()  # nothing that fails to import stays in the cache


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["truncated", "zeroed block"])
def test_damaged_precompiled_header_is_made_again(built: tuple[Path, Path], tmp_path: Path, damage: str) -> None:
    """gcc skips a truncated .gch (with a warning per TU, forever) but uses one with a block of
    zeros in it without a word: either is remade."""
    _, root, _ = copy_of(built, tmp_path)
    (gch,) = root.glob("_pch/*/opforge_module_pch.h.gch")
    data = bytearray(gch.read_bytes())
    size = len(data)
    if damage == "truncated":
        del data[len(data) // 3:]
    else:
        data[len(data) // 2: len(data) // 2 + 4096] = bytes(4096)
    gch.write_bytes(data)
    stale = gch.with_name(f".{gch.name}.99999999.tmp")  # what a process killed while precompiling leaves
    stale.write_bytes(b"partial")
    spec = write_spec(tmp_path / "specs", "sp_other")
    r = load_in_process("jit_other", spec, root, shared=root)
    assert r.returncode == 0, r.stderr
    built_line, warning = r.stdout.splitlines()
    assert built_line == f"True {LOG2}"
    reason = (rf"{re.escape(gch.name)} has {len(data)} bytes, not {size}" if damage == "truncated" else
              rf"{re.escape(gch.name)}'s content changed \(its SHA-256 is not the manifest's\)")
    assert re.fullmatch(re.escape(f"RuntimeWarning [opforge.load] {gch}: precompiled header damaged (") + reason
                        + re.escape("): removed; precompiling it again"), warning), warning
    assert jit._manifest_problem(gch.with_name("pch.json"), [gch.name]) is None  # made again, whole
    assert not stale.exists()
