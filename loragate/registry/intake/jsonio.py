"""Strict JSON for everything loragate reads from outside.

Manifests, PEFT configs, safetensors headers, golden-set lines and base configs are parsed
here, once, so that hostile input is refused as bad input instead of crashing something
later: invalid UTF-8, nesting deeper than ``MAX_DEPTH``, duplicate keys (a parser that
keeps the last one hides the first), NaN / Infinity and numbers that overflow to them,
lone surrogates (which cannot be encoded back to UTF-8) and NUL characters (which
Postgres cannot store). Every refusal names the file or field and the path inside it.
"""

from __future__ import annotations

import json
import math
from typing import Any

from loragate.registry.errors import ErrorCode, InvalidInput

MAX_DEPTH = 32


class _Refused(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _Refused(f"duplicate key {key!r}")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise _Refused(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"number {text[:40]} does not fit a double")
    return value


def _check_text(text: str, where: str) -> None:
    if "\x00" in text:
        raise _Refused(f"{where} holds a NUL character")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise _Refused(f"{where} holds a lone surrogate (\\u{ord(text[e.start]):04x})") from None


def _walk(value: Any, max_depth: int) -> None:
    """Depth, strings and keys of a parsed value, iteratively (no recursion to exhaust)."""
    stack: list[tuple[Any, str, int]] = [(value, "$", 0)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, (dict, list)) and depth >= max_depth:
            raise _Refused(f"{path[:60]}... is nested more than {max_depth} levels deep")
        if isinstance(node, dict):
            for key, child in node.items():
                _check_text(key, f"a key in {path}")
                stack.append((child, f"{path}.{key[:40]}", depth + 1))
        elif isinstance(node, list):
            stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(node))
        elif isinstance(node, str):
            _check_text(node, f"string at {path}")


def loads_strict(raw: bytes | str, *, what: str, code: ErrorCode, field: str, max_depth: int = MAX_DEPTH) -> Any:
    """Parse one JSON document from outside.

    Raises:
        InvalidInput: with ``code`` and ``field``, naming what is wrong and where.
    """
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        value = json.loads(
            text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant, parse_float=_finite_float
        )
        # A lone surrogate or a NUL can only come from a \u escape (the decoder refuses raw
        # ones), and nesting cannot be deeper than there are brackets: most documents need
        # no walk at all, which keeps register as fast as before these checks.
        if "\\u" in text or text.count("[") + text.count("{") > max_depth:
            _walk(value, max_depth)
    except UnicodeDecodeError as e:
        raise InvalidInput(f"{what} is not UTF-8: {e.reason} at byte {e.start}", code=code, field=field) from e
    except RecursionError as e:
        raise InvalidInput(f"{what} is nested more than {max_depth} levels deep", code=code, field=field) from e
    except _Refused as e:
        raise InvalidInput(f"{what}: {e}", code=code, field=field) from e
    except ValueError as e:  # json.JSONDecodeError, and int() past Python's digit limit
        raise InvalidInput(f"{what} is not valid JSON: {e}", code=code, field=field) from e
    return value


def loads_object(raw: bytes | str, *, what: str, code: ErrorCode, field: str) -> dict[str, Any]:
    """One JSON object from outside, parsed strictly.

    Raises:
        InvalidInput: with ``code`` and ``field`` when it is not strict JSON or not an object.
    """
    value = loads_strict(raw, what=what, code=code, field=field)
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object", code=code, field=field)
    return value
