"""Golden sets: the cases an adapter must get right before it may take traffic.

JSONL, one case a line: ``{"id", "prompt", <kind>: expected}`` with exactly one
expectation key, ``<kind>`` one of ``equals``, ``contains``, ``regex``, ``json_schema``,
matched against the greedy completion of ``prompt``; an optional ``max_tokens`` bounds
the completion, and an optional ``slice`` object (``{"intent": "billing", "lang": "de"}``)
names the kinds of request the case stands for, so the regression check can say which
kind a new version breaks. A set is identified by the digest of its canonical form and checked by a
great-expectations suite (unique non-blank ids and prompts, enough cases, known kinds)
before it is attached or used; a failing set is refused with every failed expectation.

Nothing in a set can make validation unbounded or reach outside: lines are strict JSON
(``loragate.registry.intake.jsonio``), sets, ids, prompts and expectations have size limits, completions
are at most ``MAX_TOKENS_LIMIT`` tokens, and matching runs on ``loragate.registry.rules.matching``
(RE2 regexes, JSON schemas that resolve only inside themselves).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from loragate.registry.digests import canonical_json, digest_of_hex, sha256_bytes
from loragate.registry.errors import ErrorCode, IntegrityFailure, InvalidInput
from loragate.registry.intake.jsonio import loads_object
from loragate.registry.rules.matching import (
    MAX_COMPLETION_CHARS,
    compile_regex,
    regex_search,
    schema_errors,
    schema_problems,
)

KINDS = ("equals", "contains", "regex", "json_schema")
DEFAULT_MAX_TOKENS = 32
MAX_TOKENS_LIMIT = 256
DEFAULT_MAX_CASES = 1000
MAX_ID_CHARS = 128
MAX_PROMPT_CHARS = 8192
MAX_EXPECTED_CHARS = 4096
_OPTIONAL_KEYS = {"max_tokens", "slice"}
FIELD = "golden_set"
# a slice is a small flat object of short labels: it names groups of cases, nothing more
MAX_SLICE_KEYS = 8
SLICE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "minProperties": 1,
    "maxProperties": MAX_SLICE_KEYS,
    "propertyNames": {"pattern": "^[a-z][a-z0-9_]{0,31}$"},
    "additionalProperties": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "^[^=,]*[^=,\\s][^=,]*$"},
}


@dataclass(frozen=True)
class GoldenCase:
    id: str
    prompt: str
    kind: str
    expected: Any
    max_tokens: int = DEFAULT_MAX_TOKENS
    # sorted (key, value) pairs of the case's ``slice`` object; empty when it has none
    slice: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"id": self.id, "prompt": self.prompt, self.kind: self.expected}
        if self.max_tokens != DEFAULT_MAX_TOKENS:
            d["max_tokens"] = self.max_tokens
        if self.slice:
            d["slice"] = dict(self.slice)
        return d

    @property
    def slice_labels(self) -> list[str]:
        """The slices the case belongs to: each ``key=value``, and their combination when
        there are several (``intent=billing``, ``lang=de``, ``intent=billing,lang=de``)."""
        labels = [f"{k}={v}" for k, v in self.slice]
        return labels + [",".join(labels)] if len(labels) > 1 else labels


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


def _rows(raw: bytes, max_cases: int) -> list[dict[str, Any]]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInput(f"golden set is not UTF-8: {e}", code=ErrorCode.INVALID_GOLDEN_SET, field=FIELD) from e
    rows: list[dict[str, Any]] = []
    # JSON Lines ends a line at \n only: str.splitlines would also split inside strings (U+2028, ...)
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        if len(rows) == max_cases:
            raise InvalidInput(
                f"golden set has more than {max_cases} cases (LORAGATE_GOLDEN_MAX_CASES)",
                code=ErrorCode.TOO_LARGE,
                field=FIELD,
            )
        where = f"{FIELD}:{lineno}"
        rows.append(
            loads_object(line, what=f"golden set line {lineno}", code=ErrorCode.INVALID_GOLDEN_SET, field=where)
        )
    return rows


def _frame(rows: list[dict[str, Any]]):
    import pandas as pd

    def text(v: Any) -> str | None:
        return v if isinstance(v, str) else (None if v is None else json.dumps(v))

    records = []
    for row in rows:
        kinds = sorted(k for k in row if k not in ("id", "prompt") and k not in _OPTIONAL_KEYS)
        records.append(
            {
                "id": text(row.get("id")),
                "prompt": text(row.get("prompt")),
                "kind": "+".join(kinds) or "(none)",
                "slice": None if "slice" not in row else json.dumps(row["slice"]),
            }
        )
    return pd.DataFrame.from_records(records, columns=["id", "prompt", "kind", "slice"])


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
        # cases without a slice are null here, and null values are not checked
        E.ExpectColumnValuesToMatchJsonSchema(column="slice", json_schema=SLICE_SCHEMA),
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
            failures.append(
                f"{label}: {r.result.get('unexpected_count')} bad, "
                f"e.g. {r.result.get('partial_unexpected_list', [])[:3]}"
            )
    return failures


def _text_failure(cid: object, key: str, value: object, limit: int) -> str | None:
    if isinstance(value, str) and len(value) > limit:
        return f"case {str(cid)[:MAX_ID_CHARS]!r}: {key} is {len(value)} characters, over the {limit} limit"
    return None


def _value_failures(rows: list[dict[str, Any]]) -> list[str]:
    failures = []
    for row in rows:
        cid = row.get("id")
        label = f"case {str(cid)[:MAX_ID_CHARS]!r}"
        for key, limit in (("id", MAX_ID_CHARS), ("prompt", MAX_PROMPT_CHARS)):
            failure = _text_failure(cid, key, row.get(key), limit)
            if failure:
                failures.append(failure)
        kinds = [k for k in KINDS if k in row]
        if len(kinds) != 1:
            continue  # already reported by the kind expectation
        kind, expected = kinds[0], row[kinds[0]]
        if kind == "json_schema":
            failures.extend(f"{label}: {problem}" for problem in schema_problems(expected))
        elif not isinstance(expected, str) or not expected:
            failures.append(f"{label}: {kind} must be a non-empty string")
        elif len(expected) > MAX_EXPECTED_CHARS:
            failures.append(f"{label}: {kind} is {len(expected)} characters, over the {MAX_EXPECTED_CHARS} limit")
        elif kind == "regex":
            try:
                compile_regex(expected)
            except ValueError as e:
                failures.append(f"{label}: regex {expected[:60]!r} is refused: {e}")
        if "max_tokens" in row:
            mt = row["max_tokens"]
            if not isinstance(mt, int) or isinstance(mt, bool) or not 1 <= mt <= MAX_TOKENS_LIMIT:
                failures.append(f"{label}: max_tokens must be an integer in 1..{MAX_TOKENS_LIMIT}")
    return failures


def parse_golden_set(raw: bytes, *, min_cases: int, max_cases: int = DEFAULT_MAX_CASES) -> GoldenSet:
    """A golden set from JSONL, checked by the great-expectations suite and case by case.

    Raises:
        InvalidInput: INVALID_GOLDEN_SET listing every failed expectation (naming the
            case), or naming the line that is not strict JSON; TOO_LARGE past ``max_cases``.
    """
    rows = _rows(raw, max_cases)
    failures = expectation_failures(rows, min_cases) + _value_failures(rows)
    if failures:
        raise InvalidInput(
            f"golden set failed {len(failures)} expectation(s): " + "; ".join(failures),
            code=ErrorCode.INVALID_GOLDEN_SET,
            field=FIELD,
        )
    return _golden_set(rows)


def digest_if_parseable(raw: bytes, max_cases: int = DEFAULT_MAX_CASES) -> str | None:
    """The digest ``raw`` would have as a golden set, without running the checks; None when
    it does not even parse. For recognising a set already attached (and checked) cheaply."""
    try:
        return _golden_set(_rows(raw, max_cases)).digest
    except (InvalidInput, KeyError, StopIteration, TypeError, ValueError):
        return None


def load_stored_golden_set(raw: bytes, digest: str) -> GoldenSet:
    """A set the registry stored after checking it: re-read, and held to its digest.

    Raises:
        IntegrityFailure: the bytes no longer form the set ``digest`` names.
    """
    try:
        golden = _golden_set(_rows(raw, max_cases=1 << 31))
    except (InvalidInput, KeyError, StopIteration) as e:
        raise IntegrityFailure(f"stored golden set {digest} no longer parses", field=FIELD) from e
    if golden.digest != digest:
        raise IntegrityFailure(f"stored golden set {digest} re-parses to {golden.digest}", field=FIELD)
    return golden


def _golden_set(rows: list[dict[str, Any]]) -> GoldenSet:
    cases = []
    for row in rows:
        kind = next(k for k in KINDS if k in row)
        cases.append(
            GoldenCase(
                id=row["id"],
                prompt=row["prompt"],
                kind=kind,
                expected=row[kind],
                max_tokens=row.get("max_tokens", DEFAULT_MAX_TOKENS),
                slice=tuple(sorted(row["slice"].items())) if isinstance(row.get("slice"), dict) else (),
            )
        )
    return GoldenSet(tuple(cases))


def match_case(case: GoldenCase, completion: str) -> tuple[bool, str]:
    """Does ``completion`` meet the case's expectation? Returns (passed, why-not).

    Surrounding whitespace is tokenization noise, so every kind sees the stripped text.
    Never raises: whatever a stored case holds, the verdict is a failed case, not a crash.
    """
    text = completion.strip()
    if len(text) > MAX_COMPLETION_CHARS:
        return False, f"completion is {len(text)} characters, over the {MAX_COMPLETION_CHARS} limit"
    try:
        return _match(case, text)
    except Exception as e:  # a set stored before a check existed; never let it crash the gate
        return False, f"the {case.kind} expectation could not be applied: {type(e).__name__}: {str(e)[:200]}"


def _match(case: GoldenCase, text: str) -> tuple[bool, str]:
    if case.kind == "equals":
        ok = text == case.expected.strip()
        return ok, "" if ok else f"expected exactly {case.expected!r}"
    if case.kind == "contains":
        ok = case.expected in text
        return ok, "" if ok else f"expected to contain {case.expected!r}"
    if case.kind == "regex":
        ok = regex_search(case.expected, text)
        return ok, "" if ok else f"expected to match /{case.expected}/"
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return False, "expected JSON, completion does not parse"
    errors = schema_errors(case.expected, value)
    return (not errors), "" if not errors else f"JSON breaks the schema: {errors[0]}"
