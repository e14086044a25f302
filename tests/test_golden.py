"""Golden sets: the great-expectations suite, canonical digests, matching."""

from __future__ import annotations

import json

import pytest

from registry.errors import ErrorCode, InvalidInput
from registry.golden import GoldenCase, match_case, parse_golden_set


def lines(*rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


GOOD = [{"id": f"c{i}", "prompt": f"prompt {i}", "equals": f"answer {i}"} for i in range(5)]


def test_a_good_set_parses_and_its_digest_ignores_formatting():
    a = parse_golden_set(lines(*GOOD), min_cases=5)
    spaced = "\n\n".join(json.dumps(r, indent=None, separators=(" , ", " : ")) for r in GOOD).encode()
    b = parse_golden_set(spaced, min_cases=5)
    assert len(a.cases) == 5 and a.digest == b.digest and a.digest.startswith("sha256:")


@pytest.mark.parametrize(
    "rows, expectation",
    [
        (GOOD[:3], "expect_table_row_count_to_be_between"),
        (GOOD[:4] + [{**GOOD[4], "id": "c0"}], "expect_column_values_to_be_unique(id)"),
        (GOOD[:4] + [{**GOOD[4], "prompt": GOOD[0]["prompt"]}], "expect_column_values_to_be_unique(prompt)"),
        (GOOD[:4] + [{**GOOD[4], "id": "  "}], "expect_column_values_to_match_regex(id)"),
        (GOOD[:4] + [{**GOOD[4], "prompt": ""}], "expect_column_values_to_match_regex(prompt)"),
        (GOOD[:4] + [{"id": "x", "equals": "y"}], "expect_column_values_to_not_be_null(prompt)"),
        (GOOD[:4] + [{"id": "x", "prompt": "p", "startswith": "y"}], "expect_column_values_to_be_in_set(kind)"),
        (GOOD[:4] + [{"id": "x", "prompt": "p", "equals": "y", "regex": "z"}], "expect_column_values_to_be_in_set(kind)"),
        (GOOD[:4] + [{"id": "x", "prompt": "p"}], "expect_column_values_to_be_in_set(kind)"),
        (GOOD[:4] + [{"id": "x", "prompt": "p", "regex": "(unclosed"}], "regex does not compile"),
        (GOOD[:4] + [{"id": "x", "prompt": "p", "json_schema": {"type": 7}}], "not a valid schema"),
        (GOOD[:4] + [{"id": "x", "prompt": "p", "equals": "y", "max_tokens": 0}], "max_tokens"),
    ],
)
def test_a_bad_set_is_refused_naming_every_failed_expectation(rows, expectation):
    with pytest.raises(InvalidInput) as err:
        parse_golden_set(lines(*rows), min_cases=5)
    assert err.value.code == ErrorCode.INVALID_GOLDEN_SET
    assert expectation in err.value.message


def test_several_failures_are_all_listed():
    rows = [GOOD[0], {**GOOD[0]}, {"id": "z", "prompt": "q", "nope": 1}]
    with pytest.raises(InvalidInput) as err:
        parse_golden_set(lines(*rows), min_cases=5)
    for expected in ("row_count", "unique(id)", "unique(prompt)", "in_set(kind)"):
        assert expected in err.value.message


def test_a_line_that_is_not_json_is_named():
    with pytest.raises(InvalidInput) as err:
        parse_golden_set(lines(*GOOD) + b"{oops\n", min_cases=5)
    assert err.value.field == "golden_set:6"


@pytest.mark.parametrize(
    "kind, expected, completion, ok",
    [
        ("equals", "ACME-OK: done", " ACME-OK: done\n", True),
        ("equals", "ACME-OK: done", " ACME-OK: done!", False),
        ("contains", "refund", "ACME-OK: refund queued", True),
        ("contains", "refund", "ACME-OK: nothing", False),
        ("regex", r"^ACME-OK: \w+", " ACME-OK: refund", True),
        ("regex", r"^ACME-OK: \d+$", "ACME-OK: refund", False),
        ("json_schema", {"type": "object", "required": ["team"]}, ' {"team": "mail"}', True),
        ("json_schema", {"type": "object", "required": ["team"]}, '{"priority": 1}', False),
        ("json_schema", {"type": "object"}, "not json", False),
    ],
)
def test_matching_each_kind(kind, expected, completion, ok):
    assert match_case(GoldenCase("c", "p", kind, expected), completion)[0] is ok
