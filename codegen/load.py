"""Load spec files: safe YAML with locations, duplicate keys rejected, schema-checked."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import cerberus
import yaml

from . import schema
from .errors import Loc, SpecError, SpecErrors, did_you_mean


class LocMap(dict):
    """A YAML mapping that remembers where its keys and values are."""

    loc: Loc
    key_locs: dict[str, Loc]
    value_locs: dict[str, Loc]
    value_styles: dict[str, Any]
    duplicates: list[tuple[str, Loc, int]]  # (key, where repeated, line first defined)


class LocList(list):
    """A YAML sequence that remembers where its items are."""

    loc: Loc
    item_locs: list[Loc]
    item_styles: list[Any]



def _shown(value: object) -> str:
    """value quoted for a message, with line breaks and other unprintable characters escaped."""
    text = str(value)
    return f"'{text}'" if text.isprintable() else ascii(text)

def _loc(path: str, node: yaml.Node) -> Loc:
    return Loc(path, node.start_mark.line + 1, node.start_mark.column + 1)


def _style(node: yaml.Node) -> str:
    """A scalar's style: "" plain, "'" or '"' quoted, "|" or ">" block, with "+" appended when
    it spans lines; "collection" for mappings and sequences."""
    if not isinstance(node, yaml.ScalarNode):
        return "collection"
    return (node.style or "") + ("+" if node.end_mark.line != node.start_mark.line else "")


class _Loader(yaml.SafeLoader):
    """SafeLoader building LocMap/LocList and rejecting duplicate keys."""

    spec_path = "<spec>"

    def construct_mapping(self, node, deep=False):  # type: ignore[override]
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

    def construct_sequence(self, node, deep=False):  # type: ignore[override]
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


def duplicate_keys(node: Any, keys: tuple = ()) -> list[SpecError]:
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


# ---------------------------------------------------------------------------- schema


_TYPE_NAMES = {"string": "a string", "dict": "a mapping", "list": "a list", "boolean": "true or false",
               "number": "a number", "integer": "an integer"}


def _yaml_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return type(value).__name__


def _schema_at(root: dict, keys: Sequence[Any]) -> dict | None:
    """The cerberus sub-schema (a mapping of allowed keys) that applies at ``keys``."""
    rules: dict = {"type": "dict", "schema": root}
    for k in keys:
        if "schema" in rules and isinstance(rules["schema"], dict) and k in rules["schema"]:
            rules = rules["schema"][k]
        elif "valuesrules" in rules:
            rules = rules["valuesrules"]
        elif "schema" in rules and rules.get("type") == "list":
            rules = rules["schema"]
        elif isinstance(rules.get("allow_unknown"), dict):
            rules = rules["allow_unknown"]
        else:
            return None
    return rules.get("schema") if rules.get("type") == "dict" else None


def _flatten(errors: Iterable[cerberus.errors.ValidationError]):
    for err in errors:
        if err.is_group_error:
            yield from _flatten(err.child_errors)
        else:
            yield err


def _schema_message(err: cerberus.errors.ValidationError, doc: Any, base: Sequence[Any]) -> SpecError:
    keys = list(base) + list(err.document_path)
    # key paths are shown relative to the op, as every later check shows them
    def kp(ks: Sequence[Any]) -> str:
        return key_path(ks[len(base):])

    code = err.code
    value = err.value
    if code == cerberus.errors.UNKNOWN_FIELD.code:
        allowed = _schema_at(schema.OP, keys[len(base):-1]) or {}
        name = str(keys[-1])
        hint = did_you_mean(name, allowed)
        if "(" in name or ")" in name:
            hint = " (a comma splits a {...} flow mapping: quote values that contain commas)"
        return SpecError(locate(doc, keys, key=True), kp(keys[:-1]), f"unknown key '{name}'{hint}")
    if code == cerberus.errors.REQUIRED_FIELD.code:
        return SpecError(locate(doc, keys[:-1]), kp(keys[:-1]),
                         f"missing required key '{keys[-1]}'")
    if code == cerberus.errors.BAD_TYPE.code:
        return SpecError(locate(doc, keys), kp(keys),
                         f"must be {_TYPE_NAMES.get(err.constraint, err.constraint)}, got {_yaml_type(value)}")
    if code == cerberus.errors.UNALLOWED_VALUE.code and "keysrules" in err.schema_path:
        allowed = [str(a) for a in err.constraint]
        return SpecError(locate(doc, keys, key=True), kp(keys[:-1]) or str(keys[-1]),
                         f"'{value}' is not one of: {', '.join(allowed)}{did_you_mean(str(value), allowed)}")
    if code == cerberus.errors.UNALLOWED_VALUE.code:
        allowed = [str(a) for a in err.constraint]
        return SpecError(locate(doc, keys), kp(keys),
                         f"'{value}' is not one of: {', '.join(allowed)}{did_you_mean(str(value), allowed)}")
    if code == cerberus.errors.REGEX_MISMATCH.code:
        # keysrules violations point at the key: report it as a bad name.
        return SpecError(locate(doc, keys, key=True), kp(keys[:-1]) or str(keys[-1]),
                         f"invalid name {_shown(value)}: must match {err.constraint.removesuffix(chr(92) + 'Z')}")
    if code == cerberus.errors.EMPTY_NOT_ALLOWED.code:
        return SpecError(locate(doc, keys), kp(keys), "must not be empty")
    if code == cerberus.errors.MIN_LENGTH.code:
        return SpecError(locate(doc, keys), kp(keys), f"needs at least {err.constraint} items")
    if code == cerberus.errors.MAX_LENGTH.code:
        return SpecError(locate(doc, keys), kp(keys), f"takes at most {err.constraint} items")
    if code == cerberus.errors.NOT_NULLABLE.code:
        return SpecError(locate(doc, keys), kp(keys), "must not be null")
    if code == cerberus.errors.MIN_VALUE.code:
        return SpecError(locate(doc, keys), kp(keys), f"must be >= {err.constraint}")
    return SpecError(locate(doc, keys), kp(keys), f"invalid value ({err.rule}: {err.constraint})")


_VALIDATOR = cerberus.Validator(schema.OP)


def _normalize_inputs(body: LocMap) -> None:
    """Input shorthand ``x: T`` becomes ``x: {dtype: T}`` (keeping its location)."""
    inputs = body.get("inputs")
    if not isinstance(inputs, LocMap):
        return
    for name, value in list(inputs.items()):
        if isinstance(value, str):
            full = LocMap(dtype=value)
            full.loc = inputs.value_locs[name]
            full.key_locs = {"dtype": full.loc}
            full.value_locs = {"dtype": full.loc}
            full.value_styles = {"dtype": inputs.value_styles[name]}
            dict.__setitem__(inputs, name, full)


def check_schema(doc: LocMap, name: str) -> list[SpecError]:
    body = doc[name]
    if not isinstance(body, LocMap):
        return [SpecError(doc.value_locs[name], name, f"must be a mapping, got {_yaml_type(body)}")]
    _normalize_inputs(body)
    if _VALIDATOR.validate(dict(body)):
        return []
    errors = [_schema_message(e, doc, [name]) for e in _flatten(_VALIDATOR._errors)]
    unique = {str(e): e for e in errors}
    return list(unique.values())


# ---------------------------------------------------------------------------- files


def read_spec_document(path: str | os.PathLike[str]) -> tuple[str, LocMap]:
    """Read one spec file: returns (op name, document) after the schema check."""
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
    if not isinstance(doc, LocMap) or not doc:
        raise SpecError(Loc(shown, 1, 1), "", "a spec is a mapping with one key, the op name")
    stem = Path(path).stem
    if len(doc) != 1:
        second = list(doc)[1]
        raise SpecError(doc.key_locs[second], second,
                        "a spec file defines exactly one op (one top-level key)")
    name = next(iter(doc))
    from .formula import HELPERS
    from .model import RESERVED, RUNTIME_CLASSES, class_name, reserved_identifier

    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise SpecError(doc.key_locs[name], name, "an op name must match [a-z_][a-z0-9_]*")
    if name in RESERVED or name in HELPERS:
        raise SpecError(doc.key_locs[name], name, f"'{name}' is a reserved word and cannot name an op")
    if reserved_identifier(name):
        raise SpecError(doc.key_locs[name], name, f"'{name}' is reserved for the C++ implementation (it "
                        "contains '__' or starts with '_' and an uppercase letter) and cannot name an op")
    if class_name(name) in RUNTIME_CLASSES:
        raise SpecError(doc.key_locs[name], name, f"'{name}' would generate class {class_name(name)}, "
                        "which the runtime already defines")
    if name != stem:
        raise SpecError(doc.key_locs[name], name,
                        f"op name must match the file name '{stem}' (one name for one thing)")
    errors = check_schema(doc, name)
    if errors:
        raise SpecErrors(errors)
    return name, doc


def load_spec_file(path: str | os.PathLike[str], kernel_root: Optional[Path] = None):
    """Load and validate one spec file on its own (no cross-op checks)."""
    from .model import OpSpec

    name, doc = read_spec_document(path)
    return OpSpec.from_yaml(name, doc, kernel_root)


def spec_paths(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Expand directories to their ``*.yaml`` files, sorted for deterministic output."""
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out.extend(sorted(p.glob("*.yaml")))
        else:
            out.append(p)
    return out


def load_specs(paths: Iterable[str | os.PathLike[str]], kernel_root: Optional[Path] = None,
               known: Sequence[Any] = ()):
    """Load every spec, then run the cross-op checks; raises SpecErrors with all mistakes.

    ``kernel_root`` is where ``src/kernels/<target>/<op>.cpp`` of cpp ops must exist (not
    checked when None); ``known`` are already-built ops that formulas may call.
    """
    from .model import OpSpec, check_ops

    errors: list[SpecError] = []
    docs = []
    broken: set[str] = set()
    for path in spec_paths(paths):
        try:
            docs.append(read_spec_document(path))
        except (SpecError, SpecErrors) as exc:
            errors.extend(exc.errors if isinstance(exc, SpecErrors) else [exc])
            broken.add(Path(path).stem)
    ops: list[OpSpec] = []
    known_names = {k.name: k.loc.path for k in known}
    seen: dict[str, OpSpec] = {}
    classes: dict[str, OpSpec] = {}
    for name, doc in docs:
        try:
            op = OpSpec.from_yaml(name, doc, Path(kernel_root) if kernel_root is not None else None)
        except (SpecError, SpecErrors) as exc:
            errors.extend(exc.errors if isinstance(exc, SpecErrors) else [exc])
            broken.add(name)
            continue
        if name in seen:
            errors.append(SpecError(op.loc, name,
                                    f"two ops named '{name}' (also {seen[name].loc.path})"))
            continue
        if name in known_names:
            errors.append(SpecError(op.loc, name, f"'{name}' is already an op of opforge "
                                    f"({known_names[name]}): an op module cannot redefine it; pick another name"))
            continue
        if op.class_name in classes:
            errors.append(SpecError(op.loc, name, f"generates class {op.class_name}, as op "
                                    f"'{classes[op.class_name].name}' does ({classes[op.class_name].loc.path})"))
            continue
        seen[name] = op
        classes[op.class_name] = op
        ops.append(op)
    errors.extend(check_ops(ops, list(known), frozenset(broken)))
    if errors:
        raise SpecErrors(errors)
    return sorted(ops, key=lambda o: o.name)
