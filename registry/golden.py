"""Golden sets: the cases an adapter must get right before it may take traffic.

JSONL, one case a line: ``{"id", "prompt", <kind>: expected}`` with exactly one
expectation key, ``<kind>`` one of ``equals``, ``contains``, ``regex``, ``json_schema``,
matched against the greedy completion of ``prompt``; an optional ``max_tokens`` bounds
the completion. A set is identified by the digest of its canonical form and checked by a
great-expectations suite (unique non-blank ids and prompts, enough cases, known kinds)
before it is attached or used; a failing set is refused with every failed expectation.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from registry.digests import canonical_json, digest_of_hex, sha256_bytes
from registry.errors import ErrorCode, InvalidInput

KINDS = ("equals", "contains", "regex", "json_schema")
DEFAULT_MAX_TOKENS = 32
MAX_TOKENS_LIMIT = 256
_OPTIONAL_KEYS = {"max_tokens"}
FIELD = "golden_set"


@dataclass(frozen=True)
class GoldenCase:
    id: str
    prompt: str
    kind: str
    expected: Any
    max_tokens: int = DEFAULT_MAX_TOKENS

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "prompt": self.prompt, self.kind: self.expected}
        if self.max_tokens != DEFAULT_MAX_TOKENS:
            d["max_tokens"] = self.max_tokens
        return d


@dataclass(frozen=True)
class GoldenSet:
    cases: tuple[GoldenCase, ...]

    def canonical_bytes(self) -> bytes:
        return b"".join(canonical_json(c.as_dict()) + b"\n" for c in self.cases)

    @cached_property
    def digest(self) -> str:
        return digest_of_hex(sha256_bytes(self.canonical_bytes()))

    @property
    def max_tokens(self) -> int:
        return max(c.max_tokens for c in self.cases)


def _rows(raw: bytes) -> list[dict[str, Any]]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInput(f"golden set is not UTF-8: {e}", code=ErrorCode.INVALID_GOLDEN_SET, field=FIELD)
    rows = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as e:
            raise InvalidInput(f"golden set line {lineno} is not JSON: {e}", code=ErrorCode.INVALID_GOLDEN_SET, field=f"{FIELD}:{lineno}")
        if not isinstance(value, dict):
            raise InvalidInput(f"golden set line {lineno} is not a JSON object", code=ErrorCode.INVALID_GOLDEN_SET, field=f"{FIELD}:{lineno}")
        rows.append(value)
    return rows


def _frame(rows: list[dict[str, Any]]):
    import pandas as pd

    def text(v: Any) -> str | None:
        return v if isinstance(v, str) else (None if v is None else json.dumps(v))

    records = []
    for row in rows:
        kinds = sorted(k for k in row if k not in ("id", "prompt") and k not in _OPTIONAL_KEYS)
        records.append({"id": text(row.get("id")), "prompt": text(row.get("prompt")), "kind": "+".join(kinds) or "(none)"})
    return pd.DataFrame.from_records(records, columns=["id", "prompt", "kind"])


def expectation_failures(rows: list[dict[str, Any]], min_cases: int) -> list[str]:
    """Run the great-expectations suite; one line per failed expectation."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    # great_expectations pins some of its module loggers to INFO on import
    for name in ("great_expectations", "great_expectations.data_context.types.base"):
        logging.getLogger(name).setLevel(logging.WARNING)

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    asset = context.data_sources.add_pandas("golden").add_dataframe_asset("cases")
    batch = asset.add_batch_definition_whole_dataframe("all").get_batch(batch_parameters={"dataframe": _frame(rows)})
    E = gx.expectations
    suite = gx.ExpectationSuite(name="golden_set")
    for expectation in (
        E.ExpectTableRowCountToBeBetween(min_value=min_cases),
        E.ExpectColumnValuesToNotBeNull(column="id"),
        E.ExpectColumnValuesToMatchRegex(column="id", regex=r"\S"),
        E.ExpectColumnValuesToBeUnique(column="id"),
        E.ExpectColumnValuesToNotBeNull(column="prompt"),
        E.ExpectColumnValuesToMatchRegex(column="prompt", regex=r"\S"),
        E.ExpectColumnValuesToBeUnique(column="prompt"),
        E.ExpectColumnValuesToBeInSet(column="kind", value_set=list(KINDS)),
    ):
        suite.add_expectation(expectation)
    result = batch.validate(suite)
    failures = []
    for r in result.results:
        if r.success:
            continue
        cfg = r.expectation_config
        column = cfg.kwargs.get("column")
        label = f"{cfg.type}({column})" if column else cfg.type
        if "observed_value" in r.result and r.result.get("unexpected_count") is None:
            failures.append(f"{label}: observed {r.result['observed_value']}")
        else:
            failures.append(f"{label}: {r.result.get('unexpected_count')} bad, e.g. {r.result.get('partial_unexpected_list', [])[:3]}")
    return failures


def _value_failures(rows: list[dict[str, Any]]) -> list[str]:
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    failures = []
    for row in rows:
        cid = row.get("id")
        kinds = [k for k in KINDS if k in row]
        if len(kinds) != 1:
            continue  # already reported by the kind expectation
        kind, expected = kinds[0], row[kinds[0]]
        if kind == "json_schema":
            if not isinstance(expected, dict):
                failures.append(f"case {cid!r}: json_schema must be an object")
                continue
            try:
                Draft202012Validator.check_schema(expected)
            except SchemaError as e:
                failures.append(f"case {cid!r}: json_schema is not a valid schema: {e.message}")
        elif not isinstance(expected, str) or not expected:
            failures.append(f"case {cid!r}: {kind} must be a non-empty string")
        elif kind == "regex":
            try:
                re.compile(expected)
            except re.error as e:
                failures.append(f"case {cid!r}: regex does not compile: {e}")
        if "max_tokens" in row:
            mt = row["max_tokens"]
            if not isinstance(mt, int) or isinstance(mt, bool) or not 1 <= mt <= MAX_TOKENS_LIMIT:
                failures.append(f"case {cid!r}: max_tokens must be an integer in 1..{MAX_TOKENS_LIMIT}")
    return failures


def parse_golden_set(raw: bytes, *, min_cases: int) -> GoldenSet:
    rows = _rows(raw)
    failures = expectation_failures(rows, min_cases) + _value_failures(rows)
    if failures:
        raise InvalidInput(
            f"golden set failed {len(failures)} expectation(s): " + "; ".join(failures),
            code=ErrorCode.INVALID_GOLDEN_SET,
            field=FIELD,
        )
    cases = []
    for row in rows:
        kind = next(k for k in KINDS if k in row)
        cases.append(GoldenCase(id=row["id"], prompt=row["prompt"], kind=kind, expected=row[kind],
                                max_tokens=row.get("max_tokens", DEFAULT_MAX_TOKENS)))
    return GoldenSet(tuple(cases))


def match_case(case: GoldenCase, completion: str) -> tuple[bool, str]:
    """Does ``completion`` meet the case's expectation? Returns (passed, why-not).

    Surrounding whitespace is tokenization noise, so every kind sees the stripped text.
    """
    text = completion.strip()
    if case.kind == "equals":
        ok = text == case.expected.strip()
        return ok, "" if ok else f"expected exactly {case.expected!r}"
    if case.kind == "contains":
        ok = case.expected in text
        return ok, "" if ok else f"expected to contain {case.expected!r}"
    if case.kind == "regex":
        ok = re.search(case.expected, text) is not None
        return ok, "" if ok else f"expected to match /{case.expected}/"
    from jsonschema import Draft202012Validator

    try:
        value = json.loads(text)
    except ValueError:
        return False, "expected JSON, completion does not parse"
    errors = sorted(Draft202012Validator(case.expected).iter_errors(value), key=lambda e: list(e.path))
    return (not errors), "" if not errors else f"JSON breaks the schema: {errors[0].message}"
