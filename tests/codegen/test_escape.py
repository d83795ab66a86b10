"""Spec text reaches generated C++ and Python only through codegen/escape.py: hostile strings
(line breaks, backslashes, quotes, trigraphs, NUL, emoji, RTL marks) render to code that parses and
holds exactly the spec's text, and names that would break the generated code are spec errors."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from codegen import escape, load_specs
from codegen.gen import render_all, render_module
from test_spec_errors import LEAKY, leaky
from conftest import ROOT, write_specs

HOSTILE = [
    "plain", "", "a\nb", "line ends in \\", "\\", 'say "hi"', "'''", '"""', 'ends "', "??/ trigraph ??=",
    "nul\0byte", "tab\tcr\r", "emoji \U0001F600", "rtl \u202e mark \u200f", "\u2028sep\u2029", "\x85nel",
    "octal \1 then 7", "*/ /* -->", "\x7f del", "caf\u00e9 \u00e9\u0301",
]

ALL = "|".join(s for s in HOSTILE if "\0" not in s)  # every hostile piece in one string
GXX = shutil.which("g++")
BUILD = Path("/work/main/build/dev/op_specs")


def gxx_syntax(tmp_path: Path, text: str, name: str = "t.cpp", includes: tuple = ()) -> subprocess.CompletedProcess:
    src = tmp_path / name
    src.write_text(text, encoding="utf-8")
    args = [GXX, "-fsyntax-only", "-std=c++17", *(f"-I{i}" for i in includes), str(src)]
    return subprocess.run(args, capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(GXX is None, reason="no g++ to compile the escaped literals")
def test_cpp_str_holds_exactly_the_utf8_bytes(tmp_path: Path) -> None:
    checks = []
    for k, s in enumerate(HOSTILE):
        data = s.encode("utf-8")
        lit = escape.cpp_str(s)
        assert lit.isascii() and "\n" not in lit and "??" not in lit
        bytes_ = ", ".join(str(b) for b in data) or "0"
        checks.append(f"constexpr char s{k}[] = {lit};\n"
                      f"constexpr unsigned char b{k}[] = {{{bytes_}}};\n"
                      f"static_assert(sizeof(s{k}) == {len(data) + 1} && same(s{k}, b{k}, {len(data)}), \"{k}\");\n"
                      f"// {escape.cpp_comment(s)}\n"
                      f"static_assert(true, \"line after comment {k} is not spliced\");\n"
                      f"int after{k} = 0;\n")
    text = ("constexpr bool same(const char* a, const unsigned char* b, int n) {\n"
            "  for (int i = 0; i < n; ++i) if (static_cast<unsigned char>(a[i]) != b[i]) return false;\n"
            "  return true;\n}\n" + "".join(checks))
    result = gxx_syntax(tmp_path, text)
    assert result.returncode == 0, result.stderr
    # every `int afterN` declaration survived its comment line (a spliced line would hide it)
    assert text.count("int after") == len(HOSTILE)


@pytest.mark.parametrize("s", HOSTILE)
def test_python_escapes_round_trip(s: str) -> None:
    assert ast.literal_eval(escape.py_str(s)) == s
    assert ast.literal_eval('"""' + escape.py_docstring(s) + '"""') == s
    tree = ast.parse(f"# {escape.py_comment(s)}\nx = 1\n")
    assert [type(n) for n in tree.body] == [ast.Assign]


@pytest.mark.parametrize("s", HOSTILE)
def test_cpp_comment_is_one_line(s: str) -> None:
    text = escape.cpp_comment(s)
    assert text.isascii() and text.isprintable() and "??" not in text and not text.endswith("\\")


def hostile_spec(doc: str) -> str:
    return (LEAKY.replace("doc: Leaky ReLU.", f"doc: {ascii(doc)[0]}{ascii(doc)[1:-1]}{ascii(doc)[0]}", 1)
            .replace("alpha: {type: float, default: 0.01}",
                     "alpha: {type: float, default: 0.01}\n"
                     f"    mode: {{type: str, default: {_yaml_str(doc)}, choices: [{_yaml_str(doc)}, 'b\\\\?']}}"))


def _yaml_str(s: str) -> str:
    # YAML double-quoted scalars take the same \\uXXXX / \\UXXXXXXXX / \\xXX escapes as ascii()
    body = ascii(s)[1:-1].replace('"', '\\"')
    if ascii(s)[0] == '"':
        body = ascii(s)[1:-1]
    body = body.replace("\\'", "'")
    return f'"{body}"'


@pytest.mark.parametrize("doc", [s for s in HOSTILE if s and "\0" not in s] + [ALL], ids=range(len(HOSTILE) - 1))
def test_generated_code_with_hostile_doc_and_str_attr_parses(in_tmp: Path, real_ops, doc: str) -> None:
    spec = leaky("doc: Leaky ReLU.", f"doc: {_yaml_str(doc)}")
    spec = spec.replace("  bprop:\n    x: where(x > 0, dout, alpha * dout)\n", "").replace(
        "    x: T\n", "    x: {dtype: T, differentiable: false}\n", 1)
    spec = spec.replace("alpha: {type: float, default: 0.01}",
                        "alpha: {type: float, default: 0.01}\n"
                        f"    mode: {{type: str, default: {_yaml_str(doc)}, choices: [{_yaml_str(doc)}, 'b??/']}}")
    spec = spec.replace("where(x > 0, x, alpha * x)", f"where(mode == 'b??/', x, alpha * x)")
    write_specs(in_tmp, {"specs\nint injected = 1;\n/\\/x/leaky.yaml": spec})
    ops = load_specs([in_tmp / "specs\nint injected = 1;\n/\\/x"], known=real_ops)
    assert ops[0].doc == doc.strip() and ops[0].attr("mode").default == doc
    table = {o.name: o for o in real_ops}
    sources = {"leaky": "specs\nint injected = 1;\n/\\/x/leaky.yaml"}
    rendered = {r.name: r.text for r in render_all(ops, sources)}
    rendered.update({r.name: r.text for r in render_module(ops, sources, "hostile_mod", list(table.values()))})
    for name, text in rendered.items():
        if name.endswith((".py", ".pyi")):
            ast.parse(text, name)
    assert "\nint injected" not in rendered["leaky.cpp"]
    if doc != ALL:
        return  # one g++ run (several seconds) covers every hostile piece together
    if GXX is None or not (BUILD / "abs.h").exists():
        pytest.skip(f"C++ part skipped: g++ {'missing' if GXX is None else 'found'}, built op headers "
                    f"{'found' if (BUILD / 'abs.h').exists() else 'missing'} at {BUILD}")
    includes = (str(ROOT / "src"), str(BUILD), sysconfig.get_paths()["include"])
    for name in ("leaky.h",):
        (in_tmp / name).write_text(rendered[name], encoding="utf-8")
    result = gxx_syntax(in_tmp, rendered["leaky.cpp"], "leaky.cpp", (str(in_tmp),) + includes)
    assert result.returncode == 0, result.stderr[-3000:]
