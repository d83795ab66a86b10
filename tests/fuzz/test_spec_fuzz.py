"""Spec fuzzing: mutants of every shipped op spec are either valid or located SpecErrors, never
another exception or a hang, and accepted mutants generate Python that parses.

Fast profile: the default suite (FUZZ_SPEC_EXAMPLES examples, 300 unless set). Long profile:
    FUZZ_SPEC_EXAMPLES=10000 FUZZ_SPEC_REPORT=/tmp/fuzz.txt python -m pytest tests/fuzz/test_spec_fuzz.py -q
(then `sort /tmp/fuzz.txt | uniq -c` counts accepted and rejected mutants; hypothesis also replays
shrunk examples, so the counts can exceed the example count).
"""

from __future__ import annotations

import ast
import copy
import os
import re
import signal
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from codegen import SpecError, SpecErrors, load_specs  # noqa: E402
from codegen.gen import render_module  # noqa: E402

SPEC_DIR = ROOT / "op_specs"
SPECS = {p.stem: yaml.safe_load(p.read_text(encoding="utf-8")) for p in sorted(SPEC_DIR.glob("*.yaml"))}
EXAMPLES = int(os.environ.get("FUZZ_SPEC_EXAMPLES", "300"))
LOCATED = re.compile(r"^\S+:\d+:\d+: ")
REPORT = os.environ.get("FUZZ_SPEC_REPORT")  # a file to append "accepted"/"rejected" lines to
TIME_BOUND_S = 30  # one check of one mutant; a hang fails the test

HOSTILE = st.sampled_from(["a\nb", "x\\", '"', "'''", "\0", "\U0001F600", "\u202e", "class\n", "??/", "",
                           "errno", "__x", "\u0663", "1e400", "-" * 200, "x" * 300])
SCALAR = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), HOSTILE,
                   st.text(max_size=20))


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for k, v in enumerate(node):
            yield from _paths(v, prefix + (k,))


@st.composite
def mutants(draw):
    name = draw(st.sampled_from(sorted(SPECS)))
    doc = copy.deepcopy(SPECS[name])
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        kind = draw(st.sampled_from(["delete", "scalar", "rename", "nest", "formula"]))
        key = path[-1]
        if kind == "delete":
            del parent[key]
        elif kind == "scalar":
            parent[key] = draw(SCALAR)
        elif kind == "rename" and isinstance(parent, dict):
            parent[draw(HOSTILE | st.text(min_size=1, max_size=8))] = parent.pop(key)
        elif kind == "nest":
            value = parent[key]
            for _ in range(draw(st.integers(1, 12))):
                value = [value] if draw(st.booleans()) else {"k": value}
            parent[key] = value
        elif kind == "formula" and isinstance(parent[key], str):
            text = parent[key]
            cut = draw(st.integers(0, len(text)))
            parent[key] = text[:cut] + draw(st.sampled_from(["(", ")", ",", "x", "**", "'", "\u0663", "1e999",
                                                            "(" * 120, " == 'z'"])) + text[cut:]
    return name, doc


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang(f"checking one mutant took over {TIME_BOUND_S} s")


_KNOWN: list = []


def known_ops() -> list:
    """op_specs/'s ops (loaded once; not a fixture, so hypothesis does not print them)."""
    if not _KNOWN:
        _KNOWN.extend(load_specs([SPEC_DIR], kernel_root=ROOT))
    return _KNOWN


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(case=mutants())
def test_spec_mutants_are_valid_or_located_spec_errors(tmp_path_factory, case) -> None:
    name, doc = case
    spec_dir = tmp_path_factory.mktemp("m") / "specs"
    spec_dir.mkdir()
    text = yaml.safe_dump(doc, allow_unicode=True, width=10**6) if not isinstance(doc, str) else doc
    (spec_dir / f"{name}.yaml").write_text(text, encoding="utf-8")
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIME_BOUND_S)
    try:
        try:
            ops = load_specs([spec_dir], known=[o for o in known_ops() if o.name != name])
        except SpecErrors as exc:
            for err in exc.errors:
                assert isinstance(err, SpecError)
                assert LOCATED.match(str(err)), str(err)
            _count("rejected")
            return
        rendered = render_module(ops, {o.name: f"specs/{o.name}.yaml" for o in ops}, "fuzz_mod",
                                 [o for o in known_ops() if o.name != name])
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    for r in rendered:
        if r.name.endswith((".py", ".pyi")):
            ast.parse(r.text, r.name)
    _count("accepted")


def _count(outcome: str) -> None:
    if REPORT:
        with open(REPORT, "a", encoding="utf-8") as f:
            f.write(outcome + "\n")
