"""Hypothesis strategies for protobuf messages, built from their descriptors: every field at
its boundaries (integers at the edges of their type, hostile and very long strings, special
floats, unknown enum values), repeated fields and maps of several entries, nested messages to
a depth limit, and fields left unset. `hints` adds plausible values per field name, so that
part of the requests get past the first check and reach deeper code."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from hypothesis import strategies as st

LONG = 100_000  # characters of the longest string a strategy makes
BOUNDARY_INTS = (
    0,
    1,
    -1,
    2,
    7,
    2**31 - 1,
    -(2**31),
    2**31,
    2**32 - 1,
    2**32,
    2**53,
    2**53 + 1,
    2**63 - 1,
    -(2**63),
    2**63,
    2**64 - 1,
)
BOUNDARY_FLOATS = (
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    1e-300,
    5e-324,
    1e15,
    1e300,
    1.7976931348623157e308,
    -1.7976931348623157e308,
    math.inf,
    -math.inf,
    math.nan,
    1.7e9,  # about now, as a time
    4.2e9,
    2.0**63,
    2.0**64,
)
BOUNDARY_STRINGS = (
    "",
    " ",
    "0",
    "-1",
    "a",
    "\x00",
    "a\x00b",
    "\n",
    "a\nb",
    "a\rb",
    "\t",
    "\x7f",
    "\x1b]0;x\x07",
    "\x1b[31mred\x1b[0m",
    "\u202etxt.exe",
    "\u00e9",
    "\u4e2d\u6587",
    "\U0001f600",
    "\ufeff",
    "\u2028",
    "%s%n%x",
    "{0}{}",
    "$(id)",
    "`id`",
    "; rm -rf x",
    "../../etc/passwd",
    "/",
    "/tmp",
    "*",
    "' OR 1=1 --",
    "\\",
    "x" * 63,
    "x" * 64,
    "x" * 65,
    "x" * 255,
    "x" * 256,
    "x" * 1001,
    "x" * 4097,
    "\u00e9" * 5000,
    "x" * LONG,
    "a\n" * (LONG // 2),
)

_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}

Hints = Mapping[str, Sequence[Any]]


def integers(low: int, high: int) -> st.SearchStrategy[int]:
    edges = sorted({v for v in BOUNDARY_INTS if low <= v <= high} | {low, high})
    return st.one_of(
        st.sampled_from(edges),
        st.integers(max(low, 0), min(high, 100)),  # small: existing job ids, indices
        st.integers(low, high),
    )


def strings(max_size: int = 40) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(BOUNDARY_STRINGS),
        st.text(max_size=max_size),
        st.text(st.characters(codec="ascii"), max_size=max_size),
        st.text(st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=8),
    )


def floats(width: int = 64) -> st.SearchStrategy[float]:
    return st.one_of(st.sampled_from(BOUNDARY_FLOATS), st.floats(width=width))  # type: ignore[arg-type]


def scalar(field: FieldDescriptor, hints: Hints) -> st.SearchStrategy[Any]:
    kind = field.type
    base: st.SearchStrategy[Any]
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_STRING:
        base = strings()
    elif kind == FieldDescriptor.TYPE_BYTES:
        base = st.one_of(st.binary(max_size=64), st.just(b"\xff" * LONG))
    elif kind == FieldDescriptor.TYPE_DOUBLE:
        base = floats()
    elif kind == FieldDescriptor.TYPE_FLOAT:
        base = floats(32)
    elif kind == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        known = [v.number for v in field.enum_type.values]
        base = st.one_of(
            st.sampled_from(known), st.sampled_from(known), integers(-(2**31), 2**31 - 1)
        )
    elif kind in _INT_RANGES:
        base = integers(*_INT_RANGES[kind])
    else:  # pragma: no cover - every scalar type is handled above
        raise NotImplementedError(field.full_name)
    plausible = [v for v in hints.get(field.name, ()) if _fits(kind, v)]
    if plausible:
        return st.one_of(st.sampled_from(list(plausible)), base)
    return base


def _fits(kind: int, value: Any) -> bool:
    """Whether a hint suits a field of this type (a name can be a string here, a number there)."""
    if kind == FieldDescriptor.TYPE_STRING:
        return isinstance(value, str)
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return isinstance(value, float)
    if kind in _INT_RANGES:
        low, high = _INT_RANGES[kind]
        return type(value) is int and low <= value <= high
    return False


def messages(
    cls: type[Message],
    hints: Hints | None = None,
    depth: int = 4,
    max_repeated: int = 4,
    max_fields: int | None = None,
) -> st.SearchStrategy[Any]:
    """Instances of `cls` with any subset of its fields set, each to a fuzzed value; at most
    `max_fields` of them (a few fuzzed fields on an otherwise good request reach further)."""
    if max_fields is None:
        return _messages(cls.DESCRIPTOR, hints or {}, depth, max_repeated)
    message_class = message_factory.GetMessageClass(cls.DESCRIPTOR)
    values = {
        field.name: _field_value(field, hints or {}, depth, max_repeated)
        for field in cls.DESCRIPTOR.fields
    }
    chosen = st.lists(st.sampled_from(sorted(values)), unique=True, max_size=max_fields)
    return chosen.flatmap(
        lambda names: st.fixed_dictionaries({name: values[name] for name in names})
    ).map(lambda fields: message_class(**fields))


def _field_value(
    field: FieldDescriptor, hints: Hints, depth: int, max_repeated: int
) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        assert field.message_type is not None
        if field.message_type.GetOptions().map_entry:
            key_field = field.message_type.fields_by_name["key"]
            value_field = field.message_type.fields_by_name["value"]
            return st.dictionaries(
                scalar(key_field, hints),
                _field_value(value_field, hints, depth - 1, max_repeated),
                max_size=max_repeated,
            )
        one = _messages(field.message_type, hints, depth - 1, max_repeated)
    else:
        one = scalar(field, hints)
    if field.is_repeated:
        return st.lists(one, max_size=max_repeated)
    return one


def _messages(
    descriptor: Any, hints: Hints, depth: int, max_repeated: int
) -> st.SearchStrategy[Any]:
    cls = message_factory.GetMessageClass(descriptor)
    if depth <= 0:
        return st.just(cls())
    optional = {
        field.name: _field_value(field, hints, depth, max_repeated) for field in descriptor.fields
    }
    return st.fixed_dictionaries({}, optional=optional).map(lambda values: cls(**values))
