"""A trainer's parameter schema, as a node declares it: data from a node,
checked as data before the server keeps it, and applied to a job's params
without I/O and in bounded time.

A node is a process the server does not control, so its schema is held to
what python-jsonschema can apply safely:

- valid against the JSON Schema 2020-12 meta-schema, at most 64 KiB of JSON
  and 32 levels deep, with no lone surrogate (it could not be sent back as
  UTF-8);
- ``$ref`` only inside the document (``#...``), and no ``$id``, ``$schema``
  other than 2020-12's, ``$dynamicRef`` or the like: nothing that names
  another document, so nothing is ever fetched (and the validator's
  registry refuses to retrieve anything, should a reference slip through);
- every ``pattern`` and ``patternProperties`` name a regular expression
  RE2 accepts, and they are matched with RE2: linear time, so no pattern
  can backtrack for seconds (``^(a+)+$``). RE2 has no backreferences or
  lookaround; a schema that needs them is refused at registration.

Pure: no I/O; the worker imports it too (a worker checks its own schema).
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import jsonschema
import re2
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource
from referencing.exceptions import NoSuchResource

# Python's own regular-expression parser tells a pattern's structure
# (private, and stable since Python 3.0; sre_parse before 3.11, which warns now).
try:
    sre_constants: Any = importlib.import_module("re._constants")
    sre_parser: Any = importlib.import_module("re._parser")
except ImportError:  # Python 3.10
    sre_constants = importlib.import_module("sre_constants")
    sre_parser = importlib.import_module("sre_parse")

# A trainer's parameter schema, as JSON, is at most this long and this deep.
MAX_PARAMS_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
DIALECT = "https://json-schema.org/draft/2020-12/schema"

# Keywords that name or define other documents, or change how references
# resolve: none has a use in a trainer's parameters.
_FORBIDDEN_KEYWORDS = (
    "$id",
    "$dynamicRef",
    "$dynamicAnchor",
    "$recursiveRef",
    "$recursiveAnchor",
    "$vocabulary",
)
# Where a schema holds subschemas: one, a list of them, or a map of names to them.
_ONE = (
    "additionalProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "items",
)
_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions", "dependentSchemas")

_REPEATS = (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT)
_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a refused pattern is our 422, not a line on stderr


class SchemaRefused(ValueError):
    """Why a node's schema cannot be used."""


def depth(value: Any) -> int:
    """How deeply a JSON value nests (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level + 1)
        stack.extend((child, level + 1) for child in children)
    return deepest


def utf8_clean(value: Any) -> bool:
    """Whether every string and key in a JSON value encodes as UTF-8 (a lone
    surrogate such as ``"\\ud800"`` does not)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check(schema: dict[str, Any]) -> None:
    """Raise :class:`SchemaRefused` unless ``schema`` is safe to keep and use."""
    if depth(schema) > MAX_SCHEMA_DEPTH:
        raise SchemaRefused(f"nests deeper than {MAX_SCHEMA_DEPTH} levels")
    if not utf8_clean(schema):
        raise SchemaRefused("holds a string that is not valid Unicode (a lone surrogate)")
    size = len(json.dumps(schema))
    if size > MAX_PARAMS_SCHEMA_BYTES:
        raise SchemaRefused(f"is {size} bytes of JSON; at most {MAX_PARAMS_SCHEMA_BYTES}")
    for where, problem in _problems(schema, "#"):
        raise SchemaRefused(f"{where}: {problem}")
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "#/" + "/".join(str(p) for p in exc.absolute_path)
        raise SchemaRefused(
            f"is not a JSON Schema (2020-12): {where}: {exc.message[:200]}"
        ) from None


def _problems(schema: Any, where: str) -> Iterator[tuple[str, str]]:
    """What in the schema names another document or an unsafe pattern."""
    stack: list[tuple[Any, str]] = [(schema, where)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, dict):  # else true/false, or what the meta-schema refuses
            yield from _keyword_problems(node, at)
            stack.extend(_subschemas(node, at))


def _keyword_problems(node: dict[str, Any], at: str) -> Iterator[tuple[str, str]]:
    for keyword in _FORBIDDEN_KEYWORDS:
        if keyword in node:
            yield at, f"{keyword} is not allowed (a trainer's schema is one document)"
    if "$schema" in node and node["$schema"] not in (DIALECT, DIALECT + "#"):
        yield at, f"$schema must be {DIALECT} or left out"
    ref = node.get("$ref")
    if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
        yield at, "$ref may only point inside the schema ('#/...'): nothing is fetched"
    patterns = [node.get("pattern"), *(node.get("patternProperties") or {})]
    for pattern in patterns:
        if isinstance(pattern, str) and (problem := _regex_problem(pattern)):
            yield at, problem


def _subschemas(node: dict[str, Any], at: str) -> Iterator[tuple[Any, str]]:
    for keyword in _ONE:
        if keyword in node:
            yield node[keyword], f"{at}/{keyword}"
    for keyword in _LIST:
        if isinstance(node.get(keyword), list):
            yield from ((sub, f"{at}/{keyword}/{i}") for i, sub in enumerate(node[keyword]))
    for keyword in (*_MAP, "patternProperties"):
        if isinstance(node.get(keyword), dict):
            yield from ((sub, f"{at}/{keyword}/{k}") for k, sub in node[keyword].items())


def _regex_problem(pattern: str) -> str | None:
    try:
        _compiled(pattern)
    except re2.error as exc:
        said = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else exc
        return f"pattern {pattern[:80]!r} is not one RE2 matches in linear time ({said})"
    if _nests_unbounded_repeats(pattern):
        return (
            f"pattern {pattern[:80]!r} repeats without bound inside a repetition without "
            "bound (as in '(a+)+'): a backtracking engine (a browser's, Python's) takes "
            "exponential time on it"
        )
    return None


def _nests_unbounded_repeats(pattern: str) -> bool:
    """Whether the pattern has the shape of catastrophic backtracking: a
    repetition without bound of nothing but another (``(a+)+``, ``(a*b*)*``).
    RE2 matches it in linear time here; the schema also reaches engines that
    backtrack (the dashboard's browser, a trainer's own checks). A separator
    between the repeats (``([a-z]+-)*``) keeps it linear there too, and is
    allowed."""
    try:
        parsed = sre_parser.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return False  # Python cannot read it; RE2 could, and is what matches here
    stack: list[Any] = [parsed]
    while stack:
        for op, argument in stack.pop():
            if op in _REPEATS:
                _low, high, body = argument
                if high == sre_constants.MAXREPEAT and _only_repeats(body):
                    return True
                stack.append(body)
            elif op is sre_constants.SUBPATTERN:
                stack.append(argument[-1])
            elif op is sre_constants.BRANCH:
                stack.extend(argument[1])
    return False


def _only_repeats(items: Any) -> bool:
    """Whether ``items`` are repetitions alone (grouped or not), one of them
    without bound."""
    unbounded = False
    for op, argument in items:
        if op in _REPEATS:
            unbounded = unbounded or argument[1] == sre_constants.MAXREPEAT
        elif op is sre_constants.SUBPATTERN and _only_repeats(argument[-1]):
            unbounded = True
        else:
            return False
    return unbounded


@lru_cache(maxsize=1024)
def _compiled(pattern: str) -> Any:
    return re2.compile(pattern, _RE2_OPTIONS)


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _compiled(pattern).search(instance):
        yield ValidationError(f"{instance[:80]!r} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: Any
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for name, value in instance.items():
            if _compiled(pattern).search(name):
                yield from validator.descend(value, subschema, path=name, schema_path=pattern)


def _refuse_retrieval(uri: str) -> Resource[Any]:
    raise NoSuchResource(uri)


# Draft 2020-12 with RE2 for patterns (every other keyword as python-jsonschema has it).
_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    {"pattern": _pattern, "patternProperties": _pattern_properties},
)
# No reference is ever looked up outside the schema: not over HTTP, not on disk.
_NOTHING_FETCHED: Registry[Any] = Registry(retrieve=_refuse_retrieval)  # type: ignore[call-arg]


@lru_cache(maxsize=256)
def _validator(schema_json: str) -> Any:
    return _Validator(json.loads(schema_json), registry=_NOTHING_FETCHED)


def validator_for(schema: dict[str, Any]) -> Any:
    """A validator for a schema :func:`check` accepted (made once per schema)."""
    return _validator(json.dumps(schema, sort_keys=True))
