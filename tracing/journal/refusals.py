"""Why msgspec refused a record, in the schema's words (``'pid' must be an integer >= 0``).

The reason is read off the schema's own types, not off msgspec's message: msgspec is unpinned and
its wording may change in any release, while its verdict (refused or not) and the types
(``msgspec.structs.fields``, ``Meta`` bounds) are its public interface. The walk follows msgspec's
order, so the place named is the one msgspec stopped at: a Struct's keys as the record has them,
then its missing fields; a list's items, an object's values in order.
"""

from __future__ import annotations

import json
import operator
from math import isnan
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import msgspec

# the words of each kind of value, in the order a reason lists them
_WORDS = {"str": "a string", "number": "a number", "int": "an integer", "float": "a number", "bool": "true or false"}
_WORDS |= {"object": "an object", "array": "a list"}
_BOUNDS = {2**63 - 1: "2^63-1", -(2**63): "-2^63", 2**63: "2^63", 2**31 - 1: "2^31-1", 10**9: "1e9", -(10**9): "-1e9"}
_OPS = (("ge", ">=", operator.ge), ("gt", ">", operator.gt), ("le", "<=", operator.le), ("lt", "<", operator.lt))
_NONE = type(None)
_TYPES = {"object": dict, "array": list, "null": _NONE, "str": str, "int": int, "float": float, "bool": bool}


def reason(record: dict[str, Any], cls: type[msgspec.Struct]) -> str:
    """Why ``msgspec.convert(record, cls)`` fails (it must): ``'where' …``; a place is written as
    readers see it (``phases[0].since_s``, ``evidence["tp1"].pid``)."""
    return _struct(record, cls, "") or "not a valid record"


def _fits(value: Any, tp: Any) -> bool:
    """Whether msgspec takes ``value`` as ``tp``."""
    try:
        msgspec.convert(value, tp)
    except msgspec.ValidationError:
        return False
    return True


def _struct(value: dict[str, Any], cls: type[msgspec.Struct], where: str) -> str | None:
    fields = {f.encode_name: f for f in msgspec.structs.fields(cls)}
    for key, item in value.items():
        field = fields.get(key)
        if field is not None and not _fits(item, field.type):
            return _why(item, field.type, f"{where}.{key}" if where else key)
    for name, field in fields.items():
        if field.required and name not in value:
            return f"'{where}.{name}' is missing" if where else f"'{name}' is missing"
    return None


def _why(value: Any, tp: Any, where: str) -> str | None:
    """Why ``value`` at ``where`` is not a ``tp``."""
    branches = list(_branches(tp, ()))
    if value is None:  # a field may be missing or null only where its type says so
        return f"'{where}' must not be null" if where.isidentifier() else f"'{where}' must be {_words(branches)}"
    taken = [b for b in branches if _exactly(value, b[0])] or [b for b in branches if _loosely(value, b[0])]
    if not taken:
        return f"'{where}' must be {_words(branches)}"
    base, metas = taken[0]
    if (too_long := _length_why(value, base, metas)) is not None:
        return f"'{where}' must be {too_long}"
    origin = get_origin(base)
    if isinstance(base, type) and issubclass(base, msgspec.Struct):
        return _struct(value, base, where)
    if origin is dict:
        return next((_why(v, get_args(base)[1], f"{where}[{_key(k)}]") for k, v in _refused(value.items(), base)), None)
    if origin is list:
        return next((_why(v, get_args(base)[0], f"{where}[{i}]") for i, v in _refused(enumerate(value), base)), None)
    if origin is Literal:
        return f"'{where}' must be one of {', '.join(sorted(map(str, get_args(base))))}"
    if isinstance(value, float) and isnan(value):
        return f"'{where}' must be a number, not NaN"
    for meta in metas:
        if meta.pattern is not None:
            return f"'{where}' must be {meta.description or 'an id'}"
        for name, op, holds in _OPS:
            bound = getattr(meta, name)
            if bound is not None and not holds(value, bound):
                return f"'{where}' must be {_words([(base, ())])} {op} {_bound(bound)}"
    return None


def _branches(tp: Any, metas: tuple[Any, ...]) -> list[tuple[Any, tuple[Any, ...]]]:
    """``tp`` as the types msgspec picks among (a union's members), each with its ``Meta``s."""
    origin = get_origin(tp)
    if origin is Annotated:
        base, *extra = get_args(tp)
        return _branches(base, (*metas, *(m for m in extra if isinstance(m, msgspec.Meta))))
    if origin is Union or origin is UnionType:
        return [b for arg in get_args(tp) for b in _branches(arg, metas)]
    return [(tp, metas)]


def _kind(base: Any) -> str:
    """msgspec's name for the kind of value ``base`` takes."""
    origin = get_origin(base)
    if origin is Literal:
        return type(get_args(base)[0]).__name__
    if origin is dict or (isinstance(base, type) and issubclass(base, msgspec.Struct)):
        return "object"
    if origin in (list, tuple):
        return "array"
    return "null" if base is _NONE else getattr(base, "__name__", "any")


def _exactly(value: Any, base: Any) -> bool:
    return base is Any or type(value) is _TYPES.get(_kind(base))


def _loosely(value: Any, base: Any) -> bool:
    """What msgspec also converts: an integer to a float, a tuple to a list."""
    kind = _kind(base)
    return (kind == "float" and type(value) is int) or (kind == "array" and type(value) is tuple)


def _length_why(value: Any, base: Any, metas: tuple[Any, ...]) -> str | None:
    limit = min((m.max_length for m in metas if m.max_length is not None), default=None)
    if limit is None or len(value) <= limit:
        return None
    unit = {"str": "characters", "object": "entries", "array": "items"}[_kind(base)]
    return f"{_words([(base, ())])} of at most {limit} {unit}"


def _refused(items: Any, base: Any) -> Any:
    """The (key, value) of ``items`` that msgspec refuses as the container ``base``'s values."""
    item_type = get_args(base)[-1]
    return ((k, v) for k, v in items if not _fits(v, item_type))


def _words(branches: list[tuple[Any, tuple[Any, ...]]]) -> str:
    """``a string``, ``a number``, ``a string, a number or true/false``: what the branches take."""
    names = {_kind(base) for base, _ in branches} - {"null"}
    if {"int", "float"} <= names:  # int | float: a number
        names = (names - {"int", "float"}) | {"number"}
    words = [_WORDS.get(n, n) for n in sorted(names, key=lambda n: list(_WORDS).index(n) if n in _WORDS else 99)]
    if len(words) == 1:
        return words[0]
    words = [w.replace(" or ", "/") for w in words]  # true/false, among others
    return f"{', '.join(words[:-1])} or {words[-1]}"


def _bound(bound: float) -> str:
    if bound in _BOUNDS:
        return _BOUNDS[bound]
    return str(bound) if type(bound) is int else f"{bound:g}".replace("e+", "e")


def _key(key: Any) -> str:
    return json.dumps(key, ensure_ascii=False)
