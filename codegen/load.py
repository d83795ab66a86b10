"""Load spec files in phases: located YAML and the op name, the cerberus schema, the model (each op's
own invariants), then what needs more than one op (duplicate names and classes, the ops formulas
call) or the file system (kernel files of cpp ops)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence

import cerberus

from . import schema
from .api import Callee, lower_formulas
from .errors import Loc, SpecError, SpecErrors, did_you_mean
from .formula.graph import HELPERS
from .formula.syntax import ops_in
from .model import CompositeImpl, ImplKind, OpSpec
from .names import RESERVED, RUNTIME_CLASSES, class_name, cpp_names, reserved_identifier
from .source import LocMap, display_path, key_path, locate, read_yaml
from .targets import BUILDS, HOST, TARGETS, Backend, Build


def _shown(value: object) -> str:
    """value quoted for a message, with line breaks and other unprintable characters escaped."""
    text = str(value)
    return f"'{text}'" if text.isprintable() else ascii(text)


# ---------------------------------------------------------------------------- schema


_TYPE_NAMES = {"string": "a string", "dict": "a mapping", "list": "a list", "boolean": "true or false",
               "number": "a number", "integer": "an integer"}


def _type_names(constraint: Any) -> str:
    """A cerberus type constraint (one type or a list of them) in words."""
    types = constraint if isinstance(constraint, list) else [constraint]
    return " or ".join(_TYPE_NAMES.get(str(t), str(t)) for t in types)


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


def _schema_at(root: dict[str, Any], keys: Sequence[Any]) -> dict[str, Any] | None:
    """The cerberus sub-schema (a mapping of allowed keys) that applies at ``keys``."""
    rules: dict[str, Any] = {"type": "dict", "schema": root}
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


def _flatten(errors: Iterable[cerberus.errors.ValidationError]) -> Iterator[cerberus.errors.ValidationError]:
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
        known_keys = _schema_at(schema.OP, keys[len(base):-1]) or {}
        name = str(keys[-1])
        hint = did_you_mean(name, known_keys)
        if "(" in name or ")" in name:
            hint = " (a comma splits a {...} flow mapping: quote values that contain commas)"
        return SpecError(locate(doc, keys, key=True), kp(keys[:-1]), f"unknown key '{name}'{hint}")
    if code == cerberus.errors.REQUIRED_FIELD.code:
        return SpecError(locate(doc, keys[:-1]), kp(keys[:-1]),
                         f"missing required key '{keys[-1]}'")
    if code == cerberus.errors.BAD_TYPE.code:
        return SpecError(locate(doc, keys), kp(keys),
                         f"must be {_type_names(err.constraint)}, got {_yaml_type(value)}")
    if code == cerberus.errors.UNALLOWED_VALUE.code and "keysrules" in err.schema_path:
        allowed = [str(a) for a in err.constraint]
        return SpecError(locate(doc, keys, key=True), kp(keys[:-1]) or str(keys[-1]),
                         f"'{value}' is not one of: {', '.join(allowed)}{did_you_mean(str(value), allowed)}")
    if code == cerberus.errors.UNALLOWED_VALUE.code:
        allowed = [str(a) for a in err.constraint]
        return SpecError(locate(doc, keys), kp(keys),
                         f"'{value}' is not one of: {', '.join(allowed)}{did_you_mean(str(value), allowed)}")
    if code == cerberus.errors.REGEX_MISMATCH.code:
        shown = schema.REGEX_SHOWN.get(err.constraint, err.constraint.removesuffix(chr(92) + 'Z'))
        if "keysrules" in err.schema_path:  # a key: report it as a bad name, where the key is
            return SpecError(locate(doc, keys, key=True), kp(keys[:-1]) or str(keys[-1]),
                             f"invalid name {_shown(value)}: must match {shown}")
        return SpecError(locate(doc, keys), kp(keys), f"invalid value {_shown(value)}: must be {shown}")
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
    shown, doc = read_yaml(path)
    if not isinstance(doc, LocMap) or not doc:
        raise SpecError(Loc(shown, 1, 1), "", "a spec is a mapping with one key, the op name")
    stem = Path(path).stem
    if len(doc) != 1:
        second = list(doc)[1]
        raise SpecError(doc.key_locs[second], second,
                        "a spec file defines exactly one op (one top-level key)")
    name = next(iter(doc))
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise SpecError(doc.key_locs[name], name, "an op name must match [a-z_][a-z0-9_]*")
    if not re.match(r"_*[a-z]", name):  # (its class is CamelCase of the name: '_1' would make '1', '_' none)
        raise SpecError(doc.key_locs[name], name, "an op name needs a letter before any digit (it names the "
                        f"generated C++ class, '{class_name(name) or '(empty)'}' here)")
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


def kernel_file_errors(name: str, doc: LocMap, kernel_root: Path, build: Build = BUILDS["cpu"]) -> list[SpecError]:
    """A cpp op's kernel files, ``<kernel_root>/<the target's kernel_path>`` (targets.py:
    ``src/kernels/cpu/<op>.cpp``, ``src/kernels/cuda/<op>.cu``) for each of its targets that
    ``build`` compiles (read from the schema-checked document, so that they are reported beside the
    op's other mistakes)."""
    body = doc[name]
    impl = body["impl"]
    if len(impl) != 1 or next(iter(impl)) != ImplKind.CPP:
        return []
    errors = []
    for t in body.get("targets") or [HOST]:  # (absent: the host target)
        if t not in build.targets or (t != HOST and not build.device_kernels):
            continue  # registration rows only: this build has no kernels for that target
        kernel = kernel_root / TARGETS[Backend(t)].kernel_path(name)
        if not kernel.is_file():
            errors.append(SpecError(locate(doc, [name, "impl", "cpp"]), "impl.cpp",
                                    f"missing kernel file {display_path(str(kernel))} for target {t}"))
    return errors


def build_op(name: str, doc: LocMap, kernel_root: Optional[Path] = None, build: Build = BUILDS["cpu"]) -> OpSpec:
    """The model of one read spec, its kernel files for ``build`` checked when kernel_root is given."""
    errors = kernel_file_errors(name, doc, kernel_root, build) if kernel_root is not None else []
    try:
        op = OpSpec.from_yaml(name, doc)
    except SpecErrors as exc:
        raise SpecErrors(exc.errors + errors) from None
    if errors:
        raise SpecErrors(errors)
    return op


def load_spec_file(path: str | os.PathLike[str], kernel_root: Optional[Path] = None) -> OpSpec:
    """Load and validate one spec file on its own (no cross-op checks)."""
    name, doc = read_spec_document(path)
    return build_op(name, doc, kernel_root)


def spec_paths(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Expand directories to their ``*.yaml`` files, sorted for deterministic output."""
    out: list[Path] = []
    for given in paths:
        p = Path(given)
        if p.is_dir():
            out.extend(sorted(p.glob("*.yaml")))
        else:
            out.append(p)
    return out


def load_specs(paths: Iterable[str | os.PathLike[str]], kernel_root: Optional[Path] = None,
               known: Sequence[Callee] = (), build: Build = BUILDS["cpu"]) -> list[OpSpec]:
    """Load every spec, then run the cross-op checks; raises SpecErrors with all mistakes.

    ``kernel_root`` is where the kernel files of cpp ops (targets.py) for the targets ``build``
    compiles must exist (not checked when None); ``known`` are already-built ops that formulas may call (their specs, or
    only their signatures), whose names a spec may not take.
    """
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
    known_names = {k.name: f" ({k.loc.path})" if isinstance(k, OpSpec) else "" for k in known}
    # (an op module's classes live beside opforge's own: their headers meet in one TU)
    known_classes = {c: k.name for k in known for c in cpp_names(k.name)}
    seen: dict[str, OpSpec] = {}
    classes: dict[str, OpSpec] = {}
    for name, doc in docs:
        try:
            op = build_op(name, doc, Path(kernel_root) if kernel_root is not None else None, build)
        except (SpecError, SpecErrors) as exc:
            errors.extend(exc.errors if isinstance(exc, SpecErrors) else [exc])
            broken.add(name)
            continue
        if name in seen:
            errors.append(SpecError(op.loc, name,
                                    f"two ops named '{name}' (also {seen[name].loc.path})"))
            continue
        if name in known_names:
            errors.append(SpecError(op.loc, name, f"'{name}' is already an op of opforge"
                                    f"{known_names[name]}: an op module cannot redefine it; pick another name"))
            continue
        clash = sorted(cpp_names(name) & known_classes.keys())
        if clash:
            errors.append(SpecError(op.loc, name, f"generates C++ name {clash[0]}, as opforge's op "
                                    f"'{known_classes[clash[0]]}' does: pick another name"))
            continue
        clash = sorted(cpp_names(name) & classes.keys())
        if clash:
            errors.append(SpecError(op.loc, name, f"generates C++ name {clash[0]}, as op "
                                    f"'{classes[clash[0]].name}' does ({classes[clash[0]].loc.path})"))
            continue
        seen[name] = op
        classes.update({c: op for c in cpp_names(name)})
        ops.append(op)
    errors.extend(check_ops(ops, list(known), frozenset(broken)))
    if errors:
        raise SpecErrors(errors)
    return sorted(ops, key=lambda o: o.name)


# ---------------------------------------------------------------------------- cross-op checks


def check_ops(ops: Sequence[OpSpec], extra: Sequence[Callee] = (),
              broken: frozenset[str] = frozenset()) -> list[SpecError]:
    """Checks that need every op: the ops that formulas call exist and are called correctly.

    Ops whose formulas call an op in ``broken`` (a spec that failed to load) are skipped: they
    are checked again once that spec is fixed, rather than reported as calling an unknown op.
    """
    errors: list[SpecError] = []
    table: dict[str, Callee] = {o.name: o for o in extra}
    table.update({o.name: o for o in ops})
    for op in ops:
        if broken & called_ops(op):
            continue
        try:
            lower_formulas(op, table)  # formulas are checked by lowering them, as dest does
        except SpecError as exc:
            errors.append(exc)
    return errors + composite_cycles(ops)


def composite_cycles(ops: Sequence[OpSpec]) -> list[SpecError]:
    """A composite op whose formula reaches itself through composite ops (r(x) + 1, or a calling b
    calling a) would recurse until the stack overflows (the process crashed): refused, naming the
    path."""
    formulas = {o.name: o.impl.formula for o in ops if isinstance(o.impl, CompositeImpl)}
    calls = {name: sorted(ops_in(f.ast) & formulas.keys()) for name, f in formulas.items()}
    errors = []
    for name in sorted(formulas):
        paths = [[name, c] for c in calls[name]]
        seen: set[str] = set()
        while paths:
            path = paths.pop(0)
            if path[-1] == name:
                f = formulas[name]
                errors.append(SpecError(f.loc, f.key, "the composite formula calls itself"
                                        + ("" if len(path) == 2 else f" through {' -> '.join(path[1:-1])}")
                                        + ": it would recurse without end"))
                break
            if path[-1] not in seen:
                seen.add(path[-1])
                paths += [path + [c] for c in calls[path[-1]]]
    return errors


def called_ops(op: OpSpec) -> set[str]:
    """The ops op's formulas (composite, bprop, jvp) call, operators included (x * y is mul)."""
    return set().union(*[ops_in(f.ast) for f in op.formulas()])
