"""The live split's rules outside vLLM: the sticky bucket and its share, the routing table
from the registry's rows, and the middleware's behaviour over a fake ASGI app (which version
answers, the fallback chain, the headers, the figures). Request ids and feedback:
tests/test_traffic_feedback_units.py; what a client sends: tests/test_traffic_client_units.py;
the breaker's states: tests/test_traffic_breaker.py; tests/test_traffic_split.py drives real
replicas."""

from __future__ import annotations

import json
import math
import random

import pytest
from loragate_resolver import request_ids, routing
from loragate_resolver.breaker import CLOSED
from loragate_resolver.live_stats import Reservoir

from tests.support.split import (
    BUCKET_KEY,
    FEEDBACK_KEY,
    KEY,
    NAME,
    FakeVllm,
    _split,
    ask,
    call,
    window,
)

# -- the bucket -----------------------------------------------------------------------------


def test_a_users_bucket_is_the_same_on_every_call_and_changes_with_the_windows_secret():
    route = window(7, "c1", 0.5)
    users = [f"user-{i}" for i in range(200)]
    first = [routing.decide(route, u).version for u in users]
    assert first == [routing.decide(route, u).version for u in users]
    other = window(7, "c1", 0.5, "c" * 64)
    assert first != [routing.decide(other, u).version for u in users]


def test_a_client_cannot_compute_its_bucket_from_the_window_id_it_may_know():
    """Once the bucket was sha256(window id : user): anyone who read the window id off a
    request id picked a user that lands on the version it wanted."""
    import hashlib

    route = window(7, "c1", 0.5)
    users = [f"user-{i}" for i in range(400)]
    guessed = [int.from_bytes(hashlib.sha256(f"7:{u}".encode()).digest()[:8], "big") / 2**64 < 0.5 for u in users]
    actual = [routing.decide(route, u).canary for u in users]
    agreement = sum(g == a for g, a in zip(guessed, actual, strict=True)) / len(users)
    assert 0.4 < agreement < 0.6  # no better than a coin
    assert "b" * 64 not in repr(route) and "bucket_key" not in route.as_dict()


def test_a_window_without_a_secret_sends_nobody_to_the_canary():
    assert {routing.decide(window(7, "c1", 1.0, None), f"u{i}").canary for i in range(50)} == {False}


@pytest.mark.parametrize("share", [0.01, 0.1, 0.5, 0.9])
def test_the_canarys_share_of_users_is_within_the_binomial_99_percent_interval(share):
    n = 20000
    route = window(3, "c1", share)
    hits = sum(routing.decide(route, f"u{i}").canary for i in range(n))
    half_width = 2.576 * math.sqrt(share * (1 - share) / n)
    assert abs(hits / n - share) <= half_width


@pytest.mark.parametrize(
    ("route", "canary"),
    [
        (routing.Route(NAME, "p1"), False),
        (window(3, "c1", 0.0), False),
        (window(3, "c1", 1.0), True),
    ],
)
def test_share_zero_sends_nobody_and_share_one_everybody(route, canary):
    decisions = {routing.decide(route, f"u{i}").canary for i in range(300)}
    assert decisions == {canary}


def test_both_sides_of_a_window_are_labelled_with_it():
    route = window(3, "c1", 0.5)
    assert {routing.decide(route, f"u{i}").window for i in range(50)} == {3}


# -- names and the table ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        (f"{NAME}@v-1", (NAME, "v-1")),
        (NAME, None),
        (f"{NAME}@", None),
        (f"{NAME}@../x", None),
        ("@v1", None),
    ],
)
def test_a_qualified_name_splits_into_adapter_and_version(name, expected):
    assert routing.split_qualified(name) == expected


def test_a_version_is_served_under_the_plain_name_only_where_the_index_names_it():
    assert routing.served_name(NAME, "v1", "v1") == NAME
    assert routing.served_name(NAME, "v2", "v1") == f"{NAME}@v2"
    assert routing.served_name(NAME, "v2", None) == f"{NAME}@v2"


def test_the_table_joins_production_and_the_active_window_and_clamps_the_share():
    table = routing.routes_from_rows(
        [(NAME, "p1"), ("b/x/y", "p9")], [(4, NAME, "c1", 1.5, BUCKET_KEY), (5, "no/prod/here", "c2", 0.5, "x")]
    )
    assert table == {
        NAME: routing.Route(NAME, "p1", 4, "c1", 1.0, BUCKET_KEY),
        "b/x/y": routing.Route("b/x/y", "p9"),
    }
    assert table[NAME].as_dict() == {"production": "p1", "window": 4, "canary": "c1", "share": 1.0}


# -- the middleware over a fake app -----------------------------------------------------------


def test_a_client_gets_production_under_its_plain_name_with_a_version_header_and_a_sealed_id(split_env):
    app = FakeVllm()
    split = _split(app, routing.Route(NAME, "p1"))
    status, headers, _ = ask(split)
    assert status == 200 and app.asked == [NAME]
    assert headers[b"x-loragate-version"] == b"p1" and b"x-loragate-fallback" not in headers
    found = request_ids.verify(FEEDBACK_KEY, headers[b"x-loragate-request-id"].decode())
    assert (found.adapter, found.version, found.window) == (NAME, "p1", None)


def test_the_canary_share_goes_to_the_qualified_name_sticky_per_user(split_env):
    app = FakeVllm()
    split = _split(app, window(9, "c1", 0.5))
    seen = {}
    for i in range(40):
        user = f"u{i % 10}"
        _, headers, _ = ask(split, user=user)
        seen.setdefault(user, set()).add(headers[b"x-loragate-version"])
    assert all(len(v) == 1 for v in seen.values())
    assert set().union(*seen.values()) == {b"p1", b"c1"}
    assert set(app.asked) == {NAME, f"{NAME}@c1"}


def test_the_session_header_is_the_user_when_the_body_names_none(split_env):
    split = _split(FakeVllm(), window(9, "c1", 0.5))
    versions = {
        call(split, body={"model": NAME, "prompt": "x"}, headers=[(b"x-loragate-session", b"s-1")])[1][
            b"x-loragate-version"
        ]
        for _ in range(10)
    }
    assert len(versions) == 1


def test_a_client_naming_a_version_gets_404_and_the_app_is_not_asked(split_env):
    app = FakeVllm()
    status, _, body = ask(_split(app, routing.Route(NAME, "p1")), model=f"{NAME}@p1")
    assert status == 404 and json.loads(body)["error"]["type"] == "NotFoundError" and app.asked == []


def test_the_fleets_requests_pass_untouched_and_uncounted(split_env):
    app = FakeVllm()
    split = _split(app, window(9, "c1", 1.0))
    status, headers, _ = call(
        split, body={"model": f"{NAME}@c1", "prompt": "x"}, headers=[(b"x-loragate-admin-key", KEY.encode())]
    )
    assert status == 200 and app.asked == [f"{NAME}@c1"] and b"x-loragate-version" not in headers
    assert split.stats.versions == {}


@pytest.mark.parametrize(
    ("statuses", "answered", "reason", "charged"),
    [
        ({f"{NAME}@c1": 404}, b"p1", b"canary_failed:404", {"c1": 1, "p1": 0}),
        ({f"{NAME}@c1": 500}, b"p1", b"canary_failed:500", {"c1": 1, "p1": 0}),
        ({f"{NAME}@c1": 400}, b"p1", b"canary_failed:400", {"c1": 1, "p1": 0}),
        # production failed the request too: the canary's failure is shared, not its own
        ({f"{NAME}@c1": 404, NAME: 503}, b"base", b"canary_failed:404", {"c1": 0, "p1": 1}),
    ],
)
def test_a_failing_version_is_answered_by_the_next_and_charged_only_where_production_answered(
    split_env, statuses, answered, reason, charged
):
    app = FakeVllm(statuses)
    split = _split(app, window(9, "c1", 1.0))
    status, headers, _ = ask(split)
    assert status == 200 and headers[b"x-loragate-version"] == answered
    assert headers[b"x-loragate-fallback"] == reason
    canary = split.stats.of(NAME, "c1", 9)
    assert (canary.requests, canary.fallbacks) == (1, 1)
    assert {v: split.stats.of(NAME, v, 9).errors for v in charged} == charged


def test_a_fault_every_version_shares_is_charged_to_no_version_and_trips_no_breaker(split_env):
    app = FakeVllm({f"{NAME}@c1": 500, NAME: 500, "tiny-llama": 500})
    split = _split(app, window(9, "c1", 1.0))
    for _ in range(4):
        assert ask(split)[0] == 500
    assert split.stats.of(NAME, "c1", 9).errors == split.stats.of(NAME, "p1", 9).errors == 0
    assert split.breaker(NAME, "c1").trips == split.breaker(NAME, "p1").trips == 0
    assert split.figures()["fallback_15m"] == {"requests": 4, "fallbacks": 4}  # the replica's alert reads it


def test_production_failing_is_answered_by_the_base_model(split_env):
    app = FakeVllm({NAME: 500})
    status, headers, body = ask(_split(app, routing.Route(NAME, "p1")))
    assert status == 200 and app.asked == [NAME, "tiny-llama"] and json.loads(body)["model"] == "tiny-llama"
    assert headers[b"x-loragate-version"] == b"base" and headers[b"x-loragate-fallback"] == b"production_failed:500"


def test_a_400_every_version_gives_is_the_clients_own_and_counts_against_none(split_env):
    app = FakeVllm({NAME: 400, "tiny-llama": 400})
    split = _split(app, routing.Route(NAME, "p1"))
    status, _, _ = ask(split)
    assert status == 400
    assert split.stats.of(NAME, "p1", None).errors == 0


def test_injected_errors_trip_the_breaker_and_later_requests_skip_the_version(split_env):
    split_env.write_text(json.dumps({"c1": {"error": True}}))
    app = FakeVllm()
    split = _split(app, window(9, "c1", 1.0))
    reasons = [ask(split)[1][b"x-loragate-fallback"] for _ in range(4)]
    assert reasons == [b"canary_failed:500", b"canary_failed:500", b"breaker_open", b"breaker_open"]
    assert f"{NAME}@c1" not in app.asked  # a fault never reaches the app
    figures = split.figures()
    canary = next(v for v in figures["versions"] if v["version"] == "c1")
    assert canary["breaker"] == "open" and canary["trips"] == 1
    assert [a["kind"] for a in figures["alerts"]] == ["breaker_open"]
    assert figures["fallback_15m"] == {"requests": 4, "fallbacks": 4}


def test_the_breaker_recloses_after_the_cooldown_the_faults_file_sets(split_env):
    split_env.write_text(json.dumps({"c1": {"error": True}, "breaker": {"cooldown_s": 0}}))
    split = _split(FakeVllm(), window(9, "c1", 1.0))
    ask(split), ask(split)
    assert split.breaker(NAME, "c1").trips == 1
    split_env.write_text(json.dumps({"breaker": {"cooldown_s": 0}}) + " ")  # faults gone (size changes)
    status, headers, _ = ask(split)
    assert headers[b"x-loragate-version"] == b"c1" and b"x-loragate-fallback" not in headers
    assert split.breaker(NAME, "c1").state(split.current_limits()) == CLOSED


def test_slowness_trips_a_canary_against_productions_p99_but_never_production_itself(split_env):
    split_env.write_text(json.dumps({"breaker": {"slow": 2}}))
    split = _split(FakeVllm(), window(9, "c1", 0.0))
    for i in range(25):  # production's p99 per token, from fast answers
        ask(split, user=f"fast-{i}")
    split_env.write_text(json.dumps({"c1": {"delay_ms": 60}, "p1": {"delay_ms": 60}, "breaker": {"slow": 2}}))
    split.routes = {NAME: window(9, "c1", 1.0)}
    reasons = [ask(split, user=f"canary-{i}")[1].get(b"x-loragate-fallback") for i in range(3)]
    assert split.breaker(NAME, "c1").trips == 1 and reasons == [None, None, b"breaker_open"]
    # production as slow, many times in a row: its own tail is no reason to send its users to the base
    split.routes = {NAME: window(9, "c1", 0.0)}
    answers = [ask(split, user=f"slow-{i}")[1][b"x-loragate-version"] for i in range(5)]
    assert split.breaker(NAME, "p1").trips == 0 and answers == [b"p1"] * 5


def test_a_stream_is_forwarded_and_its_events_counted_as_tokens(split_env):
    split = _split(FakeVllm(), routing.Route(NAME, "p1"))
    status, headers, body = ask(split, stream=True)
    assert status == 200 and body.count(b"data:") == 3 and headers[b"x-loragate-version"] == b"p1"
    stats = split.stats.of(NAME, "p1", None)
    assert len(stats.ttft_ms) == 1 and len(stats.ms_per_token) == 1


def test_a_whole_answer_gives_ms_per_token_only_with_enough_tokens_that_prefill_is_a_small_part(split_env):
    split = _split(FakeVllm(tokens=16), routing.Route(NAME, "p1"))
    ask(split)
    stats = split.stats.of(NAME, "p1", None)
    assert stats.ms_per_token[0] == pytest.approx(stats.latency_ms[0] / 16)
    assert len(stats.ttft_ms) == 0  # a whole answer's first byte is its last: no first token
    # a one-token answer to a long prompt is all prefill: no per-token time, nothing to trip on
    short = _split(FakeVllm(tokens=1), routing.Route(NAME, "p1"))
    ask(short)
    assert len(short.stats.of(NAME, "p1", None).ms_per_token) == 0


def test_a_trickled_body_is_not_the_versions_time(split_env):
    split = _split(FakeVllm(), routing.Route(NAME, "p1"))
    status, _, _ = call(split, body={"model": NAME, "prompt": "hi", "user": "slow"}, trickle_s=2.0)
    assert status == 200
    assert split.stats.of(NAME, "p1", None).latency_ms[0] < 1000  # the clock starts once the body is in


def test_productions_figures_exclude_the_canarys_failed_attempt(split_env):
    split_env.write_text(json.dumps({"c1": {"delay_ms": 2000, "error": True}, "breaker": {"errors": 100}}))
    split = _split(FakeVllm(), window(9, "c1", 1.0))
    status, headers, _ = ask(split)
    assert status == 200 and headers[b"x-loragate-version"] == b"p1"
    assert split.stats.of(NAME, "p1", 9).latency_ms[0] < 1000


def test_requests_for_other_models_and_paths_pass_untouched(split_env):
    app = FakeVllm()
    split = _split(app, routing.Route(NAME, "p1"))
    _, headers, _ = ask(split, model="tiny-llama")
    assert b"x-loragate-version" not in headers and app.asked == ["tiny-llama"]
    _, headers, _ = call(split, path="/v1/embeddings", body={"model": NAME})
    assert b"x-loragate-version" not in headers


def test_figures_and_routes_need_the_admin_key(split_env):
    split = _split(FakeVllm(), routing.Route(NAME, "p1"))
    assert call(split, path="/loragate/traffic", method="GET")[0] == 401
    assert call(split, path="/loragate/routes", body={})[0] == 401
    status, _, body = call(
        split, path="/loragate/traffic", method="GET", headers=[(b"x-loragate-admin-key", KEY.encode())]
    )
    assert status == 200
    assert json.loads(body)["routes"] == {NAME: {"production": "p1", "window": None, "canary": None, "share": 0.0}}


def test_a_warm_qualified_copy_is_used_where_the_plain_name_was_unloaded():
    warm = {f"{NAME}@v1"}
    assert routing.served_name(NAME, "v1", "v1", warm) == f"{NAME}@v1"
    assert routing.served_name(NAME, "v1", "v1", warm | {NAME}) == NAME


@pytest.mark.parametrize(
    ("plain_path", "served"),
    [
        ("/adapters/acme/tiny/support/v1", NAME),  # the plain name is on v1: it answers for v1
        ("/adapters/acme/tiny/support/v1/", NAME),
        (None, NAME),  # where vLLM's table says nothing of the path, the index decides
        # the plain name still on the version moved off (a move not settled, a replica the
        # fleet could not reach while the index moved): never v1's answer under v1's name
        ("/adapters/acme/tiny/support/v2", f"{NAME}@v1"),
    ],
)
def test_the_plain_name_answers_for_a_version_only_when_it_is_loaded_from_that_versions_path(plain_path, served):
    loaded = {NAME, f"{NAME}@v1"}
    plain = routing.path_version(plain_path)
    assert routing.served_name(NAME, "v1", "v1", loaded, plain) == served


# the table the split holds when a request comes: read before production moved to p1, or
# before the adapter's first production (or from another registry) -- without a fresh read
# the request would go to the older version, or pass the split by unlabelled
STALE_TABLES = [("read-before-the-move", routing.Route(NAME, "p0")), ("adapter-not-seen-yet", None)]


@pytest.mark.parametrize("case, held", STALE_TABLES, ids=[c[0] for c in STALE_TABLES])
def test_an_index_newer_than_the_table_makes_the_split_read_the_table_again_before_routing(
    split_env, monkeypatch, case, held
):
    from loragate_resolver import registry_reader

    reads = []

    def routes_with_pins(secrets_dir):
        reads.append(secrets_dir)
        return registry_reader.RouteRows([(NAME, "p1")], [], [])

    monkeypatch.setattr(registry_reader, "routes_with_pins", routes_with_pins)
    app = FakeVllm()
    split = _split(app, held)
    split.table_started = -1.0
    _, headers, _ = ask(split)
    assert headers[b"x-loragate-version"] == b"p1" and app.asked == [NAME] and len(reads) == 1


def test_a_registry_that_cannot_be_read_keeps_the_last_table(split_env, monkeypatch):
    from loragate_resolver import registry_reader

    def routes_with_pins(secrets_dir):
        raise registry_reader.NotServable("down", "registry_unavailable")

    monkeypatch.setattr(registry_reader, "routes_with_pins", routes_with_pins)
    split = _split(FakeVllm(), routing.Route(NAME, "p1"))
    split.table_started = 0.0
    status, _, _ = call(split, path="/loragate/routes", body={}, headers=[(b"x-loragate-admin-key", KEY.encode())])
    assert status == 503 and split.routes == {NAME: routing.Route(NAME, "p1")}
    assert ask(split)[1][b"x-loragate-version"] == b"p1"


@pytest.mark.parametrize("seed", range(5))
def test_a_sides_samples_span_the_whole_window_whatever_its_rate_in_bounded_memory(seed):
    """Production's samples once were its last 4,096 (minutes at a 1 % split) while the
    canary's covered hours: each is now a uniform sample of everything its side answered."""
    kept = Reservoir(size=400, rng=random.Random(seed))
    for index in range(40_000):  # a busy side: one value per request, in order
        kept.append(float(index))
    assert len(kept) == 400 and kept.seen == 40_000
    first_half = sum(1 for v in kept if v < 20_000)
    assert 120 <= first_half <= 280  # 200 expected; 0 if only the newest were kept
    few = Reservoir(size=400)
    for index in range(30):  # a quiet side keeps every value it saw
        few.append(float(index))
    assert list(few) == [float(i) for i in range(30)]
