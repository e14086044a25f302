"""Format compliance of live answers (rules/formats.py, rules/live.py, rules/ab.py, the
plugin's answer samples): where the golden set declares an output schema, the sampled live
answers of each version are checked against it and compared as an A/B proportion; without
one nothing is measured and nothing is gated. The replica keeps a bounded, cut sample of
good non-streaming answers only."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from loragate.registry.errors import ErrorCode, ReplicaError
from loragate.registry.intake.golden import GoldenCase, GoldenSet
from loragate.registry.render.canary import canary_evidence_markdown
from loragate.registry.rules.canary import CanaryThresholds, CanaryWindow, Observation, SideStats, Verdict, WindowStatus
from loragate.registry.rules.formats import FormatCompliance, declared_schemas, measure, schema_check
from loragate.registry.rules.live import LiveStats, judge_live
from loragate.registry.rules.live_side import LiveSide

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "infra" / "vllm_plugin"
if str(PLUGIN_DIR) not in sys.path:
    sys.path.insert(0, str(PLUGIN_DIR))
from loragate_resolver import live_stats, routing  # noqa: E402
from loragate_resolver.traffic import TrafficSplit  # noqa: E402

ADAPTER, WINDOW, CANARY, PRODUCTION = "acme/tiny-llama/support", 7, "v2", "v1"
T0 = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)
BANDS = CanaryThresholds(length_s=60, min_live_requests=10)
TICKET = {"type": "object", "required": ["ticket"], "properties": {"ticket": {"type": "integer"}}}
REFUND = {"type": "object", "required": ["refund"], "properties": {"refund": {"type": "boolean"}}}
GOOD, BAD = '{"ticket": 4}', '{"ticket": "four"}'


def golden(*cases: tuple[str, Any]) -> GoldenSet:
    return GoldenSet(
        tuple(GoldenCase(f"c{i}", f"prompt {i}", kind, expected) for i, (kind, expected) in enumerate(cases))
    )


def entry(version: str, samples: list[str], window: int | None = WINDOW, requests: int = 1) -> dict:
    return {"adapter": ADAPTER, "version": version, "window": window, "requests": requests, "samples": samples}


def document(replica: str, *entries: dict) -> dict:
    return {"replica": replica, "versions": list(entries), "alerts": []}


def sides(canary: LiveSide, production: LiveSide) -> LiveStats:
    return LiveStats(canary, production, canary_version=CANARY, production_version=PRODUCTION)


def answers(compliant: int, total: int) -> tuple[str, ...]:
    return (GOOD,) * compliant + (BAD,) * (total - compliant)


# -- which sets declare a schema ----------------------------------------------------------------


def test_a_golden_set_declares_the_distinct_schemas_of_its_json_schema_cases():
    got = declared_schemas(
        golden(("json_schema", TICKET), ("equals", "x"), ("json_schema", REFUND), ("json_schema", TICKET))
    )
    assert got == [TICKET, REFUND]


@pytest.mark.parametrize(
    "golden_set",
    [None, golden(("equals", "yes"), ("contains", "ok"), ("regex", "^a"))],
    ids=["no-golden-set", "no-json-schema-case"],
)
def test_without_a_declared_schema_compliance_is_not_measured(golden_set):
    check = schema_check(declared_schemas(golden_set))
    assert check is None and measure(CANARY, [GOOD, BAD], check) is None


# -- one answer against the schemas -------------------------------------------------------------

# (case, answer text, compliant with TICKET or REFUND)
ANSWERS = [
    ("json-meeting-the-first-schema", GOOD, True),
    ("json-meeting-the-second-schema", '{"refund": true}', True),
    ("surrounding-whitespace-is-noise", '\n  {"ticket": 1}  \n', True),
    ("json-breaking-every-schema", BAD, False),
    ("malformed-json", '{"ticket": 4', False),
    ("prose", "Your ticket is 4.", False),
    ("empty", "", False),
    ("json-but-not-an-object", "[4]", False),
    ("deeply-nested-json", "[" * 100_000 + "]" * 100_000, False),
]


@pytest.mark.parametrize("case, text, compliant", ANSWERS, ids=[a[0] for a in ANSWERS])
def test_an_answer_complies_when_it_parses_and_meets_any_declared_schema(case, text, compliant):
    check = schema_check([TICKET, REFUND])
    assert check is not None and check(text) is compliant


# -- samples across replicas and the judgement --------------------------------------------------


def test_sampled_texts_are_merged_across_replicas_for_the_windows_versions_only():
    live = LiveStats.from_replicas(
        [
            document("r1", entry(CANARY, [GOOD, BAD]), entry(PRODUCTION, [GOOD]), entry(CANARY, ["old"], window=6)),
            document("r2", entry(CANARY, [GOOD]), entry(PRODUCTION, [GOOD, "{"])),
        ],
        ADAPTER,
        WINDOW,
        CANARY,
        PRODUCTION,
    )
    assert sorted(live.canary.samples) == sorted([GOOD, BAD, GOOD])
    assert sorted(live.production.samples) == sorted([GOOD, GOOD, "{"])
    assert live.canary.summary()["answers_sampled"] == 3 and "old" not in live.canary.samples


def test_a_sample_that_is_not_a_text_is_refused_with_a_code():
    with pytest.raises(ReplicaError) as caught:
        LiveStats.from_replicas([document("r1", entry(CANARY, [{"no": 1}]))], ADAPTER, WINDOW, CANARY, PRODUCTION)
    assert caught.value.code == ErrorCode.REPLICA_REFUSED


def test_the_judgement_reports_compliance_per_version_with_counts_and_rate():
    live = sides(LiveSide(requests=20, samples=answers(3, 4)), LiveSide(requests=20, samples=answers(2, 2)))
    got = judge_live(BANDS, live, 0.01, format_check=schema_check([TICKET]))
    assert got.format_compliance == {
        "canary": FormatCompliance(CANARY, 4, 3),
        "production": FormatCompliance(PRODUCTION, 2, 2),
    }
    assert got.as_dict()["format_compliance"]["canary"] == {
        "version": CANARY,
        "checked": 4,
        "compliant": 3,
        "rate": 0.75,
    }


def test_without_a_schema_the_judgement_has_no_format_figures_and_no_format_metric():
    live = sides(LiveSide(requests=20, samples=answers(0, 20)), LiveSide(requests=20, samples=answers(20, 20)))
    got = judge_live(BANDS, live, 0.01)
    assert got.format_compliance is None and got.as_dict()["format_compliance"] is None
    assert "format_compliance" not in {m.name for m in got.ab.metrics}


# (case, canary compliant/checked, production compliant/checked, worse, meets bar)
AB = [
    ("far-fewer-compliant-is-worse", (10, 100), (100, 100), True, False),
    ("equal-and-many-meets-the-bar", (1000, 1000), (1000, 1000), False, True),
    ("equal-but-few-is-not-proven", (30, 30), (30, 30), False, False),
    ("a-canary-better-than-production-meets-it", (1000, 1000), (900, 1000), False, True),
    ("no-samples-on-one-side-is-not-measured", (0, 0), (30, 30), False, None),
]


@pytest.mark.parametrize("case, canary, production, worse, meets", AB, ids=[a[0] for a in AB])
def test_format_compliance_is_an_ab_proportion_like_acceptance(case, canary, production, worse, meets):
    live = sides(LiveSide(requests=50, samples=answers(*canary)), LiveSide(requests=50, samples=answers(*production)))
    got = judge_live(BANDS, live, 0.01, format_check=schema_check([TICKET]))
    metric = {m.name: m for m in got.ab.metrics}["format_compliance"]
    assert (metric.worse, metric.meets_bar) == (worse, meets)
    assert metric.samples == (canary[1], production[1])


def test_with_the_ab_gate_a_worse_format_keeps_the_window_from_ready_and_an_unmeasured_one_does_not():
    gated = CanaryThresholds(length_s=60, min_live_requests=10, ab_gate=True)
    latencies = tuple(float(100 + i % 7) for i in range(3000))
    base = LiveSide(requests=3000, errors=0, latency_ms=latencies)
    worse = sides(
        LiveSide(requests=3000, latency_ms=latencies, samples=answers(10, 100)),
        LiveSide(requests=3000, latency_ms=latencies, samples=answers(100, 100)),
    )
    reasons = judge_live(gated, worse, 0.01, format_check=schema_check([TICKET])).not_ready_reasons
    assert any("format_compliance" in r for r in reasons)
    unmeasured = judge_live(gated, sides(base, base), 0.01, format_check=schema_check([TICKET])).not_ready_reasons
    assert not any("format_compliance" in r for r in unmeasured)


def test_the_evidence_has_a_format_compliance_row_only_when_measured():
    live = sides(LiveSide(requests=20, samples=answers(3, 4)), LiveSide(requests=20, samples=answers(2, 2)))
    window = CanaryWindow(WINDOW, ADAPTER, CANARY, WindowStatus.OPEN, T0, BANDS, share=0.01)
    probe = SideStats(requests=4, errors=0, p50_ms=11.0, p95_ms=13.0)
    for check, shown in ((schema_check([TICKET]), True), (None, False)):
        got = judge_live(BANDS, live, 0.01, format_check=check)
        at = T0 + timedelta(seconds=61)
        o = Observation(WINDOW, at, probe, probe, 0.0, [], Verdict.CONTINUE, got.monitors, [], live=got.as_dict())
        text = canary_evidence_markdown(window, [o])
        assert ("| canary | format compliance | 3/4 (75%) |" in text) is shown
        assert ("| production | format compliance | 2/2 (100%) |" in text) is shown
        assert ("| format_compliance | 0.7500 | 1.0000 |" in text) is shown


# -- the replica's samples ----------------------------------------------------------------------

KEY = "k" * 43


class AnsweringVllm:
    """Answers completions with ``choices[0].text`` and chat with ``choices[0].message.content``
    (the request's ``prompt`` / last message echoed), 500 for model ``broken``; streams when asked."""

    async def __call__(self, scope, receive, send):
        body = json.loads((await receive())["body"])
        if body.get("stream"):
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b'data: {"x": 1}\n\ndata: [DONE]\n\n'})
            return
        status = 500 if body.get("prompt") == "broken" else 200
        if scope["path"].endswith("/chat/completions"):
            choice = {"message": {"role": "assistant", "content": body["messages"][-1]["content"]}}
        else:
            choice = {"text": body["prompt"]}
        payload = json.dumps({"choices": [choice], "usage": {"completion_tokens": 2}}).encode()
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": payload})


@pytest.fixture
def split(tmp_path, monkeypatch) -> TrafficSplit:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "admin-key").write_text(KEY)
    adapters = tmp_path / "adapters"
    adapters.mkdir()
    index = {"format": 2, "roles": {"production": {ADAPTER: {"version": "p1", "path": str(adapters / "p1")}}}}
    (adapters / ".loragate-index.json").write_text(json.dumps(index))
    for name, value in {
        "LORAGATE_REPLICA_SECRETS_DIR": str(secrets),
        "LORAGATE_ADAPTER_DIR": str(adapters),
        "LORAGATE_REPLICA_ROLE": "production",
        "LORAGATE_BASE_MODEL_NAME": "",
    }.items():
        monkeypatch.setenv(name, value)
    made = TrafficSplit(AnsweringVllm())
    made._loop = "off"  # type: ignore[assignment]  # no background reads: the test sets the table
    made.routes = {ADAPTER: routing.Route(ADAPTER, "p1")}
    made.loaded = True
    made.table_started = float("inf")
    return made


def send(split: TrafficSplit, body: dict, path: str = "/v1/completions") -> None:
    raw = json.dumps({"model": ADAPTER, "user": "u", **body}).encode()

    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}

    async def sink(message):
        pass

    scope = {"type": "http", "method": "POST", "path": path, "headers": [], "server": ("h", 1)}
    asyncio.run(split(scope, receive, sink))


def test_the_replica_samples_are_bounded_cut_and_uniform_over_the_window_not_the_latest(split):
    send(split, {"prompt": "x" * 5000})
    samples = next(v for v in split.figures()["versions"] if v["version"] == "p1")["samples"]
    assert samples == ["x" * live_stats.ANSWER_SAMPLE_CHARS] and len(samples[0]) == 2000
    for i in range(1, 400):
        send(split, {"prompt": f"answer {i}"})
    samples = next(v for v in split.figures()["versions"] if v["version"] == "p1")["samples"]
    assert len(samples) == live_stats.ANSWER_SAMPLES == 32
    # a client sending its own answers last holds no sample by it: each of 400 is kept with
    # chance 32/400, so all 32 from the last 200 has odds of 2^-32
    kept = [0 if s.startswith("x") else int(s.split()[1]) for s in samples]
    assert min(kept) < 200 and max(kept) > 0


def test_the_replica_samples_chat_answers_and_not_streams_or_errors(split):
    send(split, {"messages": [{"role": "user", "content": "from chat"}]}, path="/v1/chat/completions")
    send(split, {"prompt": "streamed", "stream": True})
    send(split, {"prompt": "broken"})
    stats = split.stats.of(ADAPTER, "p1", None)
    assert list(stats.answers) == ["from chat"] and stats.requests == 3 and stats.errors == 1


def test_the_replica_samples_every_kth_answer(split, monkeypatch):
    monkeypatch.setattr(live_stats, "ANSWER_SAMPLE_EVERY", 3)
    for i in range(9):
        send(split, {"prompt": f"a{i}"})
    assert list(split.stats.of(ADAPTER, "p1", None).answers) == ["a2", "a5", "a8"]
