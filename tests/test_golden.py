"""Golden sets: the great-expectations suite, canonical digests, matching."""

from __future__ import annotations

import json

import pytest

from loragate.registry.errors import ErrorCode, InvalidInput
from loragate.registry.intake.golden import GoldenCase, match_case, parse_golden_set


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
        (
            GOOD[:4] + [{"id": "x", "prompt": "p", "equals": "y", "regex": "z"}],
            "expect_column_values_to_be_in_set(kind)",
        ),
        (GOOD[:4] + [{"id": "x", "prompt": "p"}], "expect_column_values_to_be_in_set(kind)"),
        (GOOD[:4] + [{"id": "x", "prompt": "p", "regex": "(unclosed"}], "regex '(unclosed' is refused"),
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


# -- hostile sets: nothing may reach outside, hang, or crash --------------------------


def case(**expectation) -> dict:
    return {"id": "hostile", "prompt": "hostile prompt", **expectation}


@pytest.mark.parametrize(
    "row, words",
    [
        (case(json_schema={"$ref": "http://127.0.0.1:9/schema.json"}), "points outside the schema"),
        (case(json_schema={"$ref": "file:///etc/passwd"}), "points outside the schema"),
        (case(json_schema={"$ref": "other.json#/x"}), "points outside the schema"),
        (case(json_schema={"$ref": "#/$defs/missing"}), "resolves to nothing"),
        (case(json_schema={"properties": {"a": {"$id": "http://evil/", "type": "string"}}}), "only the root"),
        (case(json_schema={"type": "string", "pattern": "(a)\\1"}), "RE2"),
        (case(json_schema={"patternProperties": {"(?=a)": {}}}), "RE2"),
        (case(regex="(a)\\1"), "RE2"),
        (case(regex="(?<=a)b"), "RE2"),
        (case(regex="a{2000}{2000}"), "RE2"),
        (case(equals="x" * 5000), "over the 4096 limit"),
        ({"id": "long", "prompt": "p" * 9000, "equals": "x"}, "over the 8192 limit"),
    ],
    ids=[
        "ref-http",
        "ref-file",
        "ref-relative",
        "ref-unresolvable",
        "nested-id",
        "schema-backreference",
        "schema-lookahead-key",
        "regex-backreference",
        "regex-lookbehind",
        "regex-too-big",
        "expected-too-long",
        "prompt-too-long",
    ],
)
def test_hostile_cases_are_refused_naming_the_case(row, words):
    with pytest.raises(InvalidInput) as err:
        parse_golden_set(lines(*GOOD, row), min_cases=5)
    assert err.value.code == ErrorCode.INVALID_GOLDEN_SET
    assert words in err.value.message and ("'hostile'" in err.value.message or "'long'" in err.value.message)


@pytest.mark.parametrize(
    "line, words",
    [
        (b'{"id": "x", "prompt": "p", "json_schema": {"maximum": NaN}}', "NaN"),
        (b'{"id": "x", "prompt": "p", "json_schema": {"maximum": 1e400}}', "does not fit a double"),
        (b'{"id": "x", "id": "y", "prompt": "p", "equals": "z"}', "duplicate key"),
        (b'{"id": "x", "prompt": "\\ud800", "equals": "z"}', "lone surrogate"),
        (b'{"id": "x", "prompt": "p\\u0000", "equals": "z"}', "NUL"),
        (b'{"id": "x", "prompt": "p", "json_schema": ' + b'{"not": ' * 100 + b"{}" + b"}" * 101, "nested"),
        (b"[" * 100_000, "nested"),
    ],
    ids=["nan", "overflow", "duplicate-key", "lone-surrogate", "nul", "deep-schema", "deep-line"],
)
def test_malformed_lines_are_refused_naming_the_line(line, words):
    with pytest.raises(InvalidInput) as err:
        parse_golden_set(lines(*GOOD) + line + b"\n", min_cases=5)
    assert (err.value.code, err.value.field) == (ErrorCode.INVALID_GOLDEN_SET, "golden_set:6")
    assert words in err.value.message


def test_more_cases_than_the_limit_are_refused_before_the_suite_runs():
    rows = [{"id": f"c{i}", "prompt": f"p{i}", "equals": "x"} for i in range(11)]
    with pytest.raises(InvalidInput) as err:
        parse_golden_set(lines(*rows), min_cases=5, max_cases=10)
    assert err.value.code == ErrorCode.TOO_LARGE


def test_a_line_separator_inside_a_string_is_not_a_line_break():
    rows = [*GOOD[:4], {"id": "sep", "prompt": "one\u2028two", "equals": "x"}]
    raw = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
    assert parse_golden_set(raw, min_cases=5).cases[-1].prompt == "one\u2028two"


def test_a_backtracking_regex_is_matched_in_linear_time():
    import time

    catastrophic = GoldenCase("c", "p", "regex", r"^([\s\S]+)+Z$")
    started = time.perf_counter()
    assert match_case(catastrophic, "a" * 50_000)[0] is False
    assert (
        match_case(
            GoldenCase("c", "p", "json_schema", {"type": "string", "pattern": r"^(a+)+$"}), '"' + "a" * 50_000 + '!"'
        )[0]
        is False
    )
    assert time.perf_counter() - started < 5  # Python's re would not finish this in a lifetime


def test_matching_a_case_never_raises_whatever_it_holds():
    """Sets stored before a check existed go through the same matcher: failed, never crashed."""
    broken = [
        GoldenCase("c", "p", "regex", "(a)\\1"),
        GoldenCase("c", "p", "json_schema", {"$ref": "http://127.0.0.1:9/x"}),
        GoldenCase("c", "p", "json_schema", {"type": 7}),
    ]
    for bad in broken:
        ok, why = match_case(bad, '"a"')
        assert ok is False and "could not be applied" in why


def test_no_schema_reference_is_ever_fetched(tmp_path):
    """A recording HTTP server stands where a hostile $ref points: nothing may reach it."""
    import http.server
    import threading
    import urllib.request

    seen: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (the stdlib's name)
            seen.append(self.path)
            body = b'{"type": "string"}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/schema.json"
        with pytest.raises(InvalidInput):
            parse_golden_set(lines(*GOOD, case(json_schema={"$ref": url})), min_cases=5)
        assert match_case(GoldenCase("c", "p", "json_schema", {"$ref": url}), '"a"')[0] is False
        with urllib.request.urlopen(url, timeout=5) as probe:
            assert probe.read()
        assert seen == ["/schema.json"]  # the server answers: only our own probe ever reached it
    finally:
        server.shutdown()
