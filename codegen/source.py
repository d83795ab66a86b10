"""Located YAML: spec text parsed safely into mappings and lists that remember where each key
and value is (1-based line and column), duplicate keys recorded for the loader to reject."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml

from .errors import Loc, SpecError, SpecErrors


class LocMap(dict):  # type: ignore[type-arg]  # (YAML values: Any)
    """A YAML mapping that remembers where its keys and values are."""

    loc: Loc
    key_locs: dict[str, Loc]
    value_locs: dict[str, Loc]
    value_styles: dict[str, str]
    duplicates: list[tuple[str, Loc, int]]  # (key, where repeated, line first defined)


class LocList(list):  # type: ignore[type-arg]
    """A YAML sequence that remembers where its items are."""

    loc: Loc
    item_locs: list[Loc]
    item_styles: list[str]


def _loc(path: str, node: yaml.Node) -> Loc:
    return Loc(path, node.start_mark.line + 1, node.start_mark.column + 1)


def _style(node: yaml.Node) -> str:
    """A scalar's style: "" plain, "'" or '"' quoted, "|" or ">" block, with "+" appended when
    it spans lines; "collection" for mappings and sequences."""
    if not isinstance(node, yaml.ScalarNode):
        return "collection"
    return (node.style or "") + ("+" if node.end_mark.line != node.start_mark.line else "")


class _Loader(yaml.SafeLoader):
    """SafeLoader building LocMap/LocList and recording duplicate keys."""

    spec_path = "<spec>"

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep)
        out = LocMap()
        out.loc = _loc(self.spec_path, node)
        out.key_locs, out.value_locs, out.value_styles = {}, {}, {}
        out.duplicates = []
        for key_node, value_node in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):
                key = str(key)
            if key in out:
                out.duplicates.append((key, _loc(self.spec_path, key_node), out.key_locs[key].line))
                continue
            out[key] = self.construct_object(value_node, deep=True)
            out.key_locs[key] = _loc(self.spec_path, key_node)
            out.value_locs[key] = _loc(self.spec_path, value_node)
            out.value_styles[key] = _style(value_node)
        return out

    def construct_sequence(self, node: Any, deep: bool = False) -> Any:
        out = LocList(self.construct_object(child, deep=True) for child in node.value)
        out.loc = _loc(self.spec_path, node)
        out.item_locs = [_loc(self.spec_path, child) for child in node.value]
        out.item_styles = [_style(child) for child in node.value]
        return out


_Loader.add_constructor("tag:yaml.org,2002:map", _Loader.construct_mapping)
_Loader.add_constructor("tag:yaml.org,2002:seq", _Loader.construct_sequence)


def display_path(path: str) -> str:
    """A spec path as errors show it: relative to the working directory when inside it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


def duplicate_keys(node: Any, keys: tuple[Any, ...] = ()) -> list[SpecError]:
    """Every repeated key in a parsed document, with its key path (below the op name)."""
    errors = []
    if isinstance(node, LocMap):
        for key, loc, first in node.duplicates:
            path = ".".join(map(str, keys[1:] + (key,))) or key
            errors.append(SpecError(loc, path, f"duplicate key (first defined at line {first})"))
        for k, v in node.items():
            errors.extend(duplicate_keys(v, keys + (k,)))
    elif isinstance(node, LocList):
        for i, v in enumerate(node):
            errors.extend(duplicate_keys(v, keys + (i,)))
    return errors


def parse_yaml(text: str, path: str) -> Any:
    """Parse YAML text with locations; YAML syntax errors become SpecErrors."""
    loader = _Loader(text)
    loader.spec_path = path
    try:
        return loader.get_single_data()
    except SpecError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        loc = Loc(path, mark.line + 1, mark.column + 1) if mark else Loc(path, 1, 1)
        raise SpecError(loc, "", f"invalid YAML: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise SpecError(Loc(path, 1, 1), "", f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()


def read_yaml(path: str | os.PathLike[str]) -> tuple[str, Any]:
    """Read one YAML file as UTF-8: (path as errors show it, located document); duplicate keys
    raise SpecErrors."""
    shown = display_path(str(path))
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SpecError(Loc(shown, 1, 1), "", f"cannot read spec: {exc.strerror}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise SpecError(Loc(shown, line, col), "",
                        f"a spec must be UTF-8 text (byte 0x{data[exc.start]:02x} is not)") from None
    doc = parse_yaml(text, shown)
    if isinstance(doc, LocMap):
        dups = duplicate_keys(doc)
        if dups:
            raise SpecErrors(dups)
    return shown, doc


# ---------------------------------------------------------------------------- locations


def locate(doc: Any, keys: Sequence[Any], *, key: bool = False) -> Loc:
    """The location of ``doc[keys[0]][keys[1]]...``: of the key itself when ``key``."""
    node = doc
    loc: Loc = doc.loc
    for i, k in enumerate(keys):
        last = i == len(keys) - 1
        if isinstance(node, LocMap) and k in node:
            loc = node.key_locs[k] if (last and key) else node.value_locs[k]
            node = node[k]
        elif isinstance(node, LocList) and isinstance(k, int) and k < len(node):
            loc = node.item_locs[k]
            node = node[k]
        else:
            break
    return loc


def key_path(keys: Iterable[Any]) -> str:
    return ".".join(str(k) for k in keys)
