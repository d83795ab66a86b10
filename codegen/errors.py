"""Spec errors that read like a compiler's: ``path:line:col: key.path: message``."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Iterable, Sequence


@dataclass(frozen=True)
class Loc:
    """A position in a spec file (1-based line and column)."""

    path: str
    line: int
    col: int

    def shifted(self, cols: int) -> "Loc":
        return Loc(self.path, self.line, self.col + cols)


class SpecError(Exception):
    """One mistake in a spec, located in its file."""

    def __init__(self, loc: Loc, key: str, message: str):
        self.loc = loc
        self.key = key
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        key = f"{self.key}: " if self.key else ""
        return f"{self.loc.path}:{self.loc.line}:{self.loc.col}: {key}{self.message}"


class SpecErrors(SpecError):
    """Every mistake found in a set of specs, in file order (a SpecError located at the first)."""

    def __init__(self, errors: Sequence[SpecError]):
        self.errors = sorted(errors, key=lambda e: (e.loc.path, e.loc.line, e.loc.col, e.key))
        first = self.errors[0]
        self.loc, self.key, self.message = first.loc, first.key, first.message
        Exception.__init__(self, str(self))

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` when a candidate is close to ``name``, else ``''``."""
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
