"""Declared records: each kind of record the tool writes (an evidence file, a deploy record, the
canary's marker, a sweep's plan) is ONE dataclass declaration, and its reading, writing, validation
and JSON Schema are all made here from that declaration, so a field cannot be checked one way and
documented another.

    @declared
    class Run(Declared):
        arm: str = fact("A", required=True, nonempty=True, expected="an arm's letter")
        repeat: int = fact(0, required=True)
        ttft_ms: dict[str, float | None] | None = None
        OMIT = frozenset({"ttft_ms"})

What a declaration says:
    the type     str, int, float, bool, Any, a Declared part, list[...] or dict[str, ...] of those;
                 `X | None` where the file may hold null
    fact(...)    required (the key must be there), nonempty, choices, minimum (a finite number at
                 least that), or a `test` of its own (value, the object holding it) with the words
                 `expected` shows and the JSON Schema fragment `schema` that says the same; `show`
                 quotes the value found
    OMIT         fields left out of the JSON when None or empty (the optional parts of a schema);
    OMIT_ZERO    counts left out of the JSON when 0
    CHECKS       rules across fields of one object (`Check`): a function giving (field, expected)
                 pairs for what is wrong, and the JSON Schema fragment that says the same, where
                 JSON Schema can
    older(data)  how a file written before a field's current shape reads (a classmethod; optional)

Keys a part does not declare are kept in its `extra` and written back as they were (a benchmark
tool's own numbers in a run), so a file read and written again is the same file.

    Part.read(data)       (the part, [problems]): ONE pass converts and checks; each problem is
                          'runs[1].arm: expected 'A' or 'B'', one per field, in declaration order
    Part.from_json(data)  the part (data already checked; problems are dropped)
    part.to_json()        the JSON data, a fresh copy
    json_schema(Part)     the JSON Schema (draft 2020-12) of the same declaration

pydantic v2 and msgspec were the alternatives, measured on the same evidence file (models of the
same 15 parts, 10,000 reads, one process, medians of 5; pydantic 2.14.4, msgspec 0.23.0): msgspec
reads in ~13 us a file but ignores the keys a Struct does not declare, with no way to keep them
(msgspec issue #490), and its omit_defaults is not our OMIT, so neither a run's tool-specific
numbers nor the file's own shape survive a round trip; pydantic reads in 56-120 us (this module
~200 us, 2-3.5x slower) and keeps undeclared keys (extra="allow"), but writes every default unless
told exclude_unset, which holds only for what was read, not for a part built in code, and costs
~113 ms of import (models included) against this module's ~42 ms on every command's start-up. The
files are what this tool is for; a reader 0.1 ms slower per file was the price of writing them back
unchanged (bench/bench_evidence_load.py: 10,000 files).
"""

from __future__ import annotations

import math
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from functools import lru_cache
from typing import Any, Callable, ClassVar, Iterable, Mapping

Problems = list[tuple[str, str]]           # (path, "path: expected ...")
Reader = Callable[[Any, str, Problems, Any], Any]   # (value, path, problems, holder) -> the value read


def plain(value: Any) -> Any:
    """`value` as JSON data (declared parts written out, containers copied)."""
    if isinstance(value, Declared):
        return value.to_json()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


# ---------------------------------------------------------------- what a field declares

@dataclass(frozen=True)
class Spec:
    required: bool = False
    nonempty: bool = False
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    test: Callable[[Any, Any], bool] | None = None
    expected: str | None = None
    schema: Mapping[str, Any] | None = None
    show: bool = False


def fact(default: Any = MISSING, *, factory: Callable[[], Any] | None = None, required: bool = False,
         nonempty: bool = False, choices: Iterable[Any] | None = None, minimum: float | None = None,
         test: Callable[[Any, Any], bool] | None = None, expected: str | None = None,
         schema: Mapping[str, Any] | None = None, show: bool = False) -> Any:
    """A declared field (see the module doc). `test(value, holder)` replaces the type's own check
    of the value (null included) and needs `expected`; the value is then read by its type."""
    if test is not None and expected is None:
        raise TypeError("fact(test=...) needs expected=...")
    spec = Spec(required, nonempty, tuple(choices) if choices is not None else None, minimum, test, expected,
                schema, show)
    if factory is not None:
        return field(default_factory=factory, metadata={"spec": spec})
    return field(default=default, metadata={"spec": spec})


@dataclass(frozen=True)
class Check:
    """A rule across the fields of one object: `find(data)` gives (field, expected) for each
    departure (data is the object's JSON, already read field by field); `schema`, the JSON Schema
    fragment that says the same (merged into the object's), where JSON Schema can say it."""

    find: Callable[[Mapping[str, Any]], Iterable[tuple[str, str]]]
    schema: Mapping[str, Any] | None = None


def extra_field() -> Any:
    """The `extra` field every part declares last: the keys it does not declare, kept as they were."""
    return field(default_factory=dict, kw_only=True, repr=False)


# ---------------------------------------------------------------- the parts

class Declared:
    """A declared record or part of one (a dataclass made by `declared`; see the module doc)."""

    OMIT: ClassVar[frozenset[str]] = frozenset()
    OMIT_ZERO: ClassVar[frozenset[str]] = frozenset()
    CHECKS: ClassVar[tuple[Check, ...]] = ()
    extra: dict[str, Any]

    @classmethod
    def older(cls, data: Mapping[str, Any]) -> Mapping[str, Any]:
        """`data` in today's shape (a part whose older files differ overrides this)."""
        return data

    @classmethod
    def read(cls, data: Any, where: str = "") -> tuple[Any, list[str]]:
        """(the part read from JSON `data`, every way `data` departs from the declaration)."""
        problems: Problems = []
        part = _object_reader(cls)(data, where, problems, None)
        return part, _one_per_field(problems)

    @classmethod
    def problems(cls, data: Any) -> list[str]:
        return cls.read(data)[1]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]):
        return _read_object(cls, data, "", [])

    @classmethod
    def of(cls, value: Any):
        """`value` if it is already this part, else read from its JSON."""
        return value if isinstance(value, cls) else cls.from_json(value)

    def to_json(self) -> dict[str, Any]:
        out = {}
        for name in _names(type(self)):
            value = getattr(self, name)
            if name in self.OMIT and _absent(value) or name in self.OMIT_ZERO and value == 0:
                continue
            out[name] = plain(value)
        out.update(plain(self.extra))
        return out

    def __eq__(self, other: object) -> bool:
        """Parts are equal when their JSON is: compare a part with its JSON by `to_json()`."""
        if isinstance(other, Declared):
            return self.to_json() == other.to_json()
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  (mutable)


def declared(cls):
    """The dataclass decorator of every declared part (equality is by JSON, see Declared.__eq__)."""
    return dataclass(eq=False)(cls)


def _absent(value: Any) -> bool:
    """What an OMIT field leaves out of the JSON: None, an empty list, an empty object."""
    return value is None or (isinstance(value, (list, dict)) and not value)


def _one_per_field(problems: Problems) -> list[str]:
    """The first problem of each field: a value the type check refused is not judged again by a
    rule across fields."""
    seen: set[str] = set()
    out = []
    for path, text in problems:
        if path not in seen:
            seen.add(path)
            out.append(text)
    return out


def _spec(f: Any) -> Spec:
    return f.metadata.get("spec") or Spec()


@lru_cache(maxsize=None)
def _names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls) if f.name != "extra")


@lru_cache(maxsize=None)
def _plan(cls: type) -> dict[str, tuple[Reader, bool, str, tuple[type, ...]]]:
    """{field: (its reader, whether it is required, what it expects, the exact types its reader would
    pass unchanged)}, in declaration order."""
    hints = typing.get_type_hints(cls)
    plan = {}
    for f in fields(cls):
        if f.name == "extra":
            continue
        spec = _spec(f)
        words = _expected(hints[f.name], spec) + (", got None" if spec.show else "")
        plan[f.name] = (_field_reader(hints[f.name], spec), spec.required, words, _exact_types(hints[f.name], spec))
    return plan


_JSON_SCALARS = (str, int, float, bool, type(None))
# the exact types (bool is not an int here: type(True) is bool) a scalar field takes as they are
_EXACT = {str: (str,), int: (int,), float: (float, int), bool: (bool,)}


def _exact_types(hint: Any, spec: Spec) -> tuple[type, ...]:
    """The types of value the field's reader would return unchanged with no problem: the fast path
    of a read (a few hundred fields per evidence file). Anything else goes through the reader."""
    if spec.test is not None or spec.choices is not None or spec.minimum is not None or spec.nonempty:
        return ()
    inner, nullable = _optional(hint)
    if inner is Any or inner is object:
        return _JSON_SCALARS
    exact = _EXACT.get(inner, ())
    return exact + (type(None),) if exact and nullable else exact


def _read_object(cls: type, data: Mapping[str, Any], where: str, problems: Problems) -> Any:
    data = cls.older(data)
    plan = _plan(cls)
    kwargs: dict[str, Any] = {}
    for name, (read, required, words, exact) in plan.items():
        if name in data:
            value = data[name]
            if type(value) in exact:   # a plain value of the field's type: nothing to check or convert
                kwargs[name] = value
            else:
                kwargs[name] = read(value, f"{where}.{name}" if where else name, problems, data)
        elif required:
            path = f"{where}.{name}" if where else name
            problems.append((path, f"{path}: expected {words}"))
    extra = {key: plain(value) for key, value in data.items() if key not in plan} if len(kwargs) < len(data) else {}
    for check in cls.CHECKS:
        for name, words in check.find(data):
            path = f"{where}.{name}" if where else name
            problems.append((path, f"{path}: expected {words}"))
    try:
        return cls(**kwargs, extra=extra)
    except TypeError:   # a field without a default is missing: named above
        if not problems:
            raise
        return None


# ---------------------------------------------------------------- readers made from the types

def _optional(hint: Any) -> tuple[Any, bool]:
    """(the type without None, whether None is allowed)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return (inner[0] if len(inner) == 1 else typing.Union[tuple(inner)]), True
    return hint, False


def _is_part(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, Declared)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# the type -> (its test, the words for it)
_SCALARS: dict[Any, tuple[Callable[[Any], bool], str]] = {
    str: (lambda v: isinstance(v, str), "a string"),
    int: (_is_int, "an integer"),
    float: (_is_number, "a number"),
    bool: (lambda v: isinstance(v, bool), "true or false"),
}


def _kind_words(hint: Any) -> str:
    hint, _ = _optional(hint)
    origin = typing.get_origin(hint) or hint
    if hint in _SCALARS:
        return _SCALARS[hint][1]
    if _is_part(hint) or origin is dict:
        return "an object"
    if origin is list:
        return "a list"
    return "a value"


def _choice_words(choices: tuple[Any, ...]) -> str:
    if len(choices) == 2:
        return f"{choices[0]!r} or {choices[1]!r}"
    return f"one of {', '.join(str(c) for c in choices)}"


def _expected(hint: Any, spec: Spec) -> str:
    if spec.expected:
        return spec.expected
    if spec.choices is not None:
        return _choice_words(spec.choices)
    if spec.minimum is not None:
        return f"a finite number >= {spec.minimum:g}"
    words = _kind_words(hint)
    if spec.nonempty:
        return words.replace("a ", "a non-empty ", 1)
    return words


def _type_reader(hint: Any) -> Reader:
    """How a value of type `hint` is read and checked (null allowed where the type says so)."""
    inner, nullable = _optional(hint)
    read = _inner_reader(inner)
    if not nullable:
        return read

    def optional(value, path, problems, holder):
        return None if value is None else read(value, path, problems, holder)
    return optional


def _inner_reader(hint: Any) -> Reader:
    if hint is Any or hint is object:
        return lambda value, path, problems, holder: plain(value)
    if _is_part(hint):
        return _object_reader(hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        tests = [_SCALARS[a][0] for a in args if a in _SCALARS]
        words = " or ".join(_kind_words(a) for a in args)

        def either(value, path, problems, holder):
            if not any(t(value) for t in tests):
                problems.append((path, f"{path}: expected {words}"))
            return plain(value)
        return either
    if hint in _SCALARS:
        test, words = _SCALARS[hint]

        def scalar(value, path, problems, holder):
            if not test(value):
                problems.append((path, f"{path}: expected {words}"))
            return value
        return scalar
    if (origin or hint) is list:
        item = _type_reader(args[0]) if args and args[0] is not Any else None
        exact = _exact_types(args[0], Spec()) if item is not None else ()

        def listed(value, path, problems, holder):
            if not isinstance(value, list):
                problems.append((path, f"{path}: expected a list"))
                return plain(value)
            if item is None:
                return plain(value)
            return [v if type(v) in exact else item(v, f"{path}[{i}]", problems, value) for i, v in enumerate(value)]
        return listed
    if (origin or hint) is dict:
        item = _type_reader(args[1]) if len(args) == 2 and args[1] is not Any else None
        exact = _exact_types(args[1], Spec()) if item is not None else ()

        def mapped(value, path, problems, holder):
            if not isinstance(value, dict):
                problems.append((path, f"{path}: expected an object"))
                return plain(value)
            if item is None:
                return plain(value)
            return {k: v if type(v) in exact else item(v, f"{path}.{k}", problems, value) for k, v in value.items()}
        return mapped
    raise TypeError(f"declared: no reader for type {hint!r}")


def _object_reader(cls: type) -> Reader:
    def part(value, path, problems, holder):
        if isinstance(value, cls):
            value = value.to_json()
        if not isinstance(value, dict):
            problems.append((path, f"{path or '(top level)'}: expected {'an object' if path else 'a JSON object'}"))
            return plain(value)
        return _read_object(cls, value, path, problems)
    return part


def _kind_test(hint: Any) -> Callable[[Any], bool]:
    """Whether a value is of the type's kind at the top (a string, an object, a list, ...)."""
    inner, _ = _optional(hint)
    origin = typing.get_origin(inner) or inner
    if inner in _SCALARS:
        return _SCALARS[inner][0]
    if _is_part(inner):
        return lambda v: isinstance(v, (dict, inner))
    if origin is dict:
        return lambda v: isinstance(v, dict)
    if origin is list:
        return lambda v: isinstance(v, list)
    return lambda v: True


def _field_reader(hint: Any, spec: Spec) -> Reader:
    """The type's reader with the field's narrower rules in front of it."""
    read = _type_reader(hint)
    if spec.test is None and spec.choices is None and spec.minimum is None and not spec.nonempty \
            and spec.expected is None:
        return read
    words = _expected(hint, spec)
    kind = _kind_test(hint)

    def narrowed(value, path, problems, holder):
        if spec.test is not None:
            ok = spec.test(value, holder)
        elif value is None and _optional(hint)[1]:
            return None
        elif not kind(value):
            ok = False
        elif spec.choices is not None:
            ok = value in spec.choices
        elif spec.minimum is not None:
            ok = _is_number(value) and math.isfinite(value) and value >= spec.minimum
        elif spec.nonempty:
            ok = bool(value)
        else:
            ok = True
        if not ok:
            problems.append((path, f"{path}: expected {words}" + (f", got {value!r}" if spec.show else "")))
            return plain(value)
        return read(value, path, problems, holder)
    return narrowed


# ---------------------------------------------------------------- the JSON Schema of a declaration

def json_schema(cls: type, title: str | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of declared record `cls` and every part it holds."""
    defs: dict[str, Any] = {}
    _define(cls, defs)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title or cls.__name__,
            "$ref": f"#/$defs/{cls.__name__}", "$defs": dict(sorted(defs.items()))}


def _define(cls: type, defs: dict[str, Any]) -> None:
    if cls.__name__ in defs:
        return
    defs[cls.__name__] = {}   # taken before its fields: a part may hold itself
    hints = typing.get_type_hints(cls)
    props, required = {}, []
    for f in fields(cls):
        if f.name == "extra":
            continue
        spec = _spec(f)
        props[f.name] = _field_schema(hints[f.name], spec, defs)
        if spec.required:
            required.append(f.name)
    doc = (cls.__doc__ or "").strip()
    out: dict[str, Any] = {"type": "object"}
    if doc and not doc.startswith(f"{cls.__name__}("):
        out["description"] = " ".join(doc.split("\n\n")[0].split())
    out["properties"] = props
    if required:
        out["required"] = required
    out["additionalProperties"] = True   # undeclared keys are kept (`extra`)
    fragments = [dict(c.schema) for c in cls.CHECKS if c.schema]
    if fragments:
        out["allOf"] = fragments
    defs[cls.__name__] = out


def _field_schema(hint: Any, spec: Spec, defs: dict[str, Any]) -> dict[str, Any]:
    inner, nullable = _optional(hint)
    if spec.schema is not None:
        return dict(spec.schema)
    base = _type_schema(inner, defs)
    if spec.choices is not None:
        base = {"enum": list(spec.choices)}
    if spec.minimum is not None:
        base = {**base, "minimum": spec.minimum}
    if spec.nonempty:
        base = {**base, ("minLength" if base.get("type") == "string" else "minItems" if base.get("type") == "array"
                         else "minProperties"): 1}
    return {"anyOf": [base, {"type": "null"}]} if nullable else base


def _type_schema(hint: Any, defs: dict[str, Any]) -> dict[str, Any]:
    inner, nullable = _optional(hint)
    if nullable:
        return {"anyOf": [_type_schema(inner, defs), {"type": "null"}]}
    if hint is Any or hint is object:
        return {}
    if _is_part(hint):
        _define(hint, defs)
        return {"$ref": f"#/$defs/{hint.__name__}"}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_type_schema(a, defs) for a in args]}
    simple = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if hint in simple:
        return {"type": simple[hint]}
    if (origin or hint) is list:
        return {"type": "array", **({"items": _type_schema(args[0], defs)} if args and args[0] is not Any else {})}
    if (origin or hint) is dict:
        return {"type": "object",
                **({"additionalProperties": _type_schema(args[1], defs)} if len(args) == 2 and args[1] is not Any else {})}
    raise TypeError(f"declared: no JSON Schema for type {hint!r}")
