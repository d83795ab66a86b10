"""One escaping function per target language for spec text that reaches generated output."""

from __future__ import annotations

import re

_CPP_SIMPLE = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "?": "\\?"}


def cpp_str(s: str) -> str:
    """A C++ narrow string literal holding s's UTF-8 bytes (trigraphs and non-ASCII escaped).

    Bytes outside printable ASCII become octal escapes (at most 3 digits, so a following digit is
    never swallowed, unlike \\x which has no length limit)."""
    out = []
    for b in s.encode("utf-8", "surrogatepass"):
        c = chr(b)
        if c in _CPP_SIMPLE:
            out.append(_CPP_SIMPLE[c])
        elif 0x20 <= b < 0x7F:
            out.append(c)
        else:
            out.append(f"\\{b:03o}")
    return '"' + "".join(out) + '"'


def cpp_comment(s: str) -> str:
    """Text safe inside one // comment line: no line break, no trailing backslash (line splice),
    no trigraph (??/ is a backslash), ASCII only."""
    text = s.encode("ascii", "backslashreplace").decode("ascii")
    text = "".join(ch if 0x20 <= ord(ch) < 0x7F else f"\\x{ord(ch):02x}" for ch in text)
    # a backslash is shown as \x5c (so no line ends in one) and a ? before a ? as \x3f (no trigraph)
    return re.sub(r"\?(?=\?)", r"\\x3f", text.replace("\\", "\\x5c"))


def py_str(s: str) -> str:
    """A Python string literal holding s (ASCII-only repr)."""
    return ascii(s)


def py_comment(s: str) -> str:
    """Text safe inside one # comment line."""
    return "".join(ch if 0x20 <= ord(ch) < 0x7F else f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else
                   ascii(ch)[1:-1] for ch in s)


def py_docstring(s: str) -> str:
    """The body of a triple-quoted (non-raw) Python docstring holding s."""
    body = s.replace("\\", "\\\\").replace('"', '\\"')
    body = "".join(ch if ch in "\n\t" or 0x20 <= ord(ch) < 0x7F or ord(ch) > 0x9F and ch not in "\u2028\u2029\x85"
                   else ascii(ch)[1:-1] for ch in body)
    return body
