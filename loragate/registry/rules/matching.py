"""Matching a completion against a golden expectation, in bounded time and with no I/O.

Regexes -- a golden case's ``regex`` and the ``pattern`` / ``patternProperties`` keywords
of its JSON schemas -- run on RE2, a linear-time engine: no pattern can make validation
hang. Patterns RE2 cannot compile (backreferences, lookaround) are refused when the set is
attached. JSON schemas resolve only references inside themselves: a ``$ref`` to a URL or a
file would be fetched by a default validator, so it is refused at attach time, and at
match time the validator has a registry with nothing to retrieve from.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import re2

# a completion is at most MAX_TOKENS_LIMIT tokens; this bounds the text any matcher sees
MAX_COMPLETION_CHARS = 16_384
# RE2 compiles within this much memory or refuses the pattern
RE2_MAX_MEM = 8 << 20
_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False  # RE2 would print to stderr; the refusal says it instead
    options.max_mem = RE2_MAX_MEM
    return options


@lru_cache(maxsize=1024)
def compile_regex(pattern: str) -> Any:
    """The pattern compiled by RE2; ValueError saying why when RE2 cannot run it."""
    try:
        return re2.compile(pattern, options=_options())
    except re2.error as e:
        reason = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise ValueError(f"the linear-time regex engine (RE2) cannot run it: {reason}") from None


def regex_search(pattern: str, text: str) -> bool:
    return compile_regex(pattern).search(text) is not None


def _subschemas(schema: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object in a schema with its JSON pointer, iteratively."""
    stack: list[tuple[str, Any]] = [("#", schema)]
    while stack:
        pointer, node = stack.pop()
        if isinstance(node, dict):
            yield pointer, node
            stack.extend((f"{pointer}/{k}", v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((f"{pointer}/{i}", v) for i, v in enumerate(node))


def schema_problems(schema: Any) -> list[str]:
    """What stops ``schema`` from being used as a golden expectation, one line each."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError
    from referencing import Registry
    from referencing.exceptions import Unresolvable
    from referencing.jsonschema import DRAFT202012

    if not isinstance(schema, dict):
        return ["json_schema must be an object"]
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        return [f"json_schema is not a valid schema: {e.message}"]
    problems = []
    refs = []
    for pointer, node in _subschemas(schema):
        if "$id" in node and pointer != "#":
            problems.append(f"json_schema sets $id at {pointer}: only the root may name itself")
        for keyword in _REF_KEYWORDS:
            ref = node.get(keyword)
            if isinstance(ref, str):
                if not ref.startswith("#"):
                    problems.append(
                        f"json_schema {keyword} {ref[:80]!r} at {pointer} points outside the schema "
                        "(only references inside it, starting with '#', are resolved)"
                    )
                else:
                    refs.append(ref)
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            problems.extend(_pattern_problem(pattern, f"{pointer}/pattern"))
        properties = node.get("patternProperties")
        if isinstance(properties, dict):
            for key in properties:
                problems.extend(_pattern_problem(key, f"{pointer}/patternProperties"))
    if problems:
        return problems
    resolver = Registry().resolver_with_root(DRAFT202012.create_resource(schema))
    for ref in refs:
        try:
            resolver.lookup(ref)
        except Unresolvable:
            problems.append(f"json_schema $ref {ref[:80]!r} resolves to nothing in the schema")
    return problems


def _pattern_problem(pattern: str, where: str) -> list[str]:
    try:
        compile_regex(pattern)
    except ValueError as e:
        return [f"json_schema pattern {pattern[:60]!r} at {where}: {e}"]
    return []


def _frozen(schema: Any) -> str:
    return json.dumps(schema, sort_keys=True)


@lru_cache(maxsize=256)
def _validator(frozen: str) -> Any:
    """A Draft 2020-12 validator whose regex keywords run on RE2 and which retrieves nothing."""
    from jsonschema import Draft202012Validator, validators
    from jsonschema.exceptions import ValidationError
    from referencing import Registry

    def pattern(validator: Any, value: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
        if validator.is_type(instance, "string") and not regex_search(value, instance):
            yield ValidationError(f"{instance[:80]!r} does not match {value[:80]!r}")

    def pattern_properties(validator: Any, value: dict, instance: Any, schema: Any) -> Iterator[ValidationError]:
        if not validator.is_type(instance, "object"):
            return
        for regex, subschema in value.items():
            for key, child in instance.items():
                if regex_search(regex, key):
                    yield from validator.descend(child, subschema, path=key, schema_path=regex)

    cls = validators.extend(Draft202012Validator, {"pattern": pattern, "patternProperties": pattern_properties})
    return cls(json.loads(frozen), registry=Registry())


def schema_errors(schema: dict[str, Any], instance: Any) -> list[str]:
    """Every way ``instance`` breaks ``schema``, most specific path first."""
    errors = sorted(_validator(_frozen(schema)).iter_errors(instance), key=lambda e: list(e.path))
    return [e.message for e in errors]
