"""What every schema a client sends shares: unknown fields refused, JSON
types taken as documented, and the bounds that keep values inside the
database's columns."""

from __future__ import annotations

import functools
from datetime import datetime, timezone
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

# A job spec is data with bounds: nothing in it is executed or used as a path.
MAX_WORLD_SIZE = 256
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
# Every integer that reaches the database fits its 64-bit columns.
DB_INT_MAX = 2**63 - 1
Id = Annotated[int, Field(ge=1, le=DB_INT_MAX)]
Count = Annotated[int, Field(ge=0, le=DB_INT_MAX)]
ExitCode = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]

# A report's time: any zone, but within years the database and every
# conversion to UTC handle (the ends of the calendar overflow).
EARLIEST, LATEST = (
    datetime(2000, 1, 1, tzinfo=timezone.utc),
    datetime(9000, 1, 1, tzinfo=timezone.utc),
)


def _in_reach(value: datetime) -> datetime:
    try:
        utc = value.astimezone(timezone.utc) if value.tzinfo else value.replace(tzinfo=timezone.utc)
    except OverflowError:
        raise ValueError("a time at the end of the calendar") from None
    if not EARLIEST <= utc < LATEST:
        raise ValueError(f"a time outside {EARLIEST.year}-{LATEST.year}")
    return utc


Timestamp = Annotated[datetime, AfterValidator(_in_reach)]


class Strict(BaseModel):
    """What clients send: unknown fields refused, and JSON types taken as the
    schema says: pydantic on its own would read ``true`` as 1, ``0`` as
    false and a number as a timestamp."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _json_types_as_documented(cls, value: Any, info: ValidationInfo) -> Any:
        if read_back(info):
            # Written by us as pydantic dumped it (db/types.py), its types
            # right; and a check added since must not make it unreadable.
            # Most of a job row's decoding time was this, once a field.
            return value
        # Strings, objects and nulls are pydantic's to judge; only numbers,
        # booleans and arrays can be the wrong JSON type here.
        if isinstance(value, str):
            _check_text(value)
            if info.field_name is not None and _wants_number_or_bool_in(cls, info.field_name):
                # pydantic would read "1" as 1: a string is not a number in JSON.
                raise ValueError(
                    f"a string where the schema wants {_name(_annotation(cls, info.field_name))}"
                )
            return value
        if isinstance(value, list):
            for item in value:
                if isinstance(item, str):
                    _check_text(item)
        if (
            info.field_name is not None
            and not isinstance(value, dict | None)
            and not _fits_field(cls, info.field_name, value)
        ):
            wanted = _annotation(cls, info.field_name)
            raise ValueError(f"{_kind(value)} where the schema wants {_name(wanted)}")
        return value


# What a field's annotation asks, worked out once per field and JSON type
# (an array's: the types of its items): walking the annotation at every
# value was most of the time a node's batch of 10,000 log lines took to
# read (40,000 values), and it was done again for every poll's two arrays.
_FITS: dict[tuple[type, str, Any], bool] = {}


def _annotation(model: type[BaseModel], field: str) -> Any:
    return model.model_fields[field].annotation


@functools.cache
def _wants_number_or_bool_in(model: type[BaseModel], field: str) -> bool:
    return _wants_number_or_bool(_annotation(model, field))


def _fits_field(model: type[BaseModel], field: str, value: Any) -> bool:
    kind: Any = type(value)
    if isinstance(value, list):
        kind = frozenset(map(type, value))
        if list in kind:
            # An array of arrays: whether it fits depends on the items' items.
            return _fits(_annotation(model, field), value)
    key = (model, field, kind)
    fits = _FITS.get(key)
    if fits is None:
        fits = _FITS[key] = _fits(_annotation(model, field), value)
    return fits


def _check_text(value: str) -> None:
    if "\x00" in value:
        # PostgreSQL cannot store it, and no name or address holds one.
        raise ValueError("a NUL character, which no string here may hold")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            # JSON's "\ud800" escape: no character, and no database stores it.
            raise ValueError("a lone surrogate, which is not a character") from None


# How deeply free-form JSON (a trainer's params) may nest: deeper, and a
# serializer or a recursive reader gives up (pydantic's at 255).
MAX_JSON_DEPTH = 32


def read_back(info: ValidationInfo) -> bool:
    """Whether the value is read back from the database (db/types.py), where
    a check added after it was written must not make it unreadable."""
    return isinstance(info.context, dict) and bool(info.context.get("stored"))


def check_json_data(value: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Free-form JSON a client sends, held to what every layer can store and
    read back: at most ``max_depth`` levels deep, every string and key a
    string of characters without NUL. Iterative: no recursion to exhaust."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, str):
            _check_text(item)
            continue
        if isinstance(item, dict):
            for key in item:
                _check_text(key)
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if level >= max_depth:
            raise ValueError(f"nests deeper than {max_depth} levels")
        stack.extend((child, level + 1) for child in children)


def _wants_number_or_bool(annotation: Any) -> bool:
    """Whether the annotation takes numbers or booleans and never a string."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _wants_number_or_bool(get_args(annotation)[0])
    if origin in (Union, UnionType):
        options = [a for a in get_args(annotation) if a is not type(None)]
        return bool(options) and all(_wants_number_or_bool(a) for a in options)
    return annotation in (int, float, bool)


def _fits(annotation: Any, value: Any) -> bool:
    """Whether a JSON value is of a type the annotation allows (models,
    strings and the like are left to pydantic)."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _fits(get_args(annotation)[0], value)
    if origin in (Union, UnionType):
        return any(_fits(option, value) for option in get_args(annotation))
    if origin is list and isinstance(value, list):
        (item,) = get_args(annotation) or (Any,)
        return all(_fits(item, element) for element in value)
    if annotation is bool:
        return isinstance(value, bool)
    if annotation in (int, float):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is datetime:
        return isinstance(value, str | datetime)
    if annotation is type(None):
        return value is None
    return True


_JSON_NAMES: dict[Any, str] = {
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    str: "a string",
    list: "an array",
    dict: "an object",
    datetime: "a date-time string",
    type(None): "null",
}


def _kind(value: Any) -> str:
    return "a number" if type(value) is float else _JSON_NAMES.get(type(value), "a value")


def _name(annotation: Any) -> str:
    if get_origin(annotation) is Annotated:
        return _name(get_args(annotation)[0])
    if get_origin(annotation) in (Union, UnionType):
        return " or ".join(_name(a) for a in get_args(annotation) if a is not type(None))
    if get_origin(annotation) is list:
        return "an array"
    return _JSON_NAMES.get(annotation, getattr(annotation, "__name__", str(annotation)))
