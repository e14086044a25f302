"""The live split on the session's real vLLM replicas (the plugin's TrafficSplit on prod-a):
every answer for an adapter names the version that gave it and carries a signed id; a client
cannot name a version; a canary window's share of users gets the canary, sticky per user; a
version whose copy fails verification is answered by the next one -- production, then the
base -- with the fallback header; injected errors trip the breaker, which closes again after
its cooldown; the figures need the fleet's key; feedback is counted once; a user's requests
on both replicas are one unit of the window's figures.

The registry reader's side (routes, ``name@version``) is checked on SQLite and Postgres
outside vLLM. Pure rules: tests/test_traffic_split_units.py."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from kit.tamper import flip_a_byte
from loragate.local.replica_secrets import (
    ADMIN_KEY_FILE,
    FEEDBACK_KEY_FILE,
    replica_registry_url,
    write_replica_secrets,
)
from loragate.registry.rules.canary import WindowStatus
from loragate.registry.rules.fleet import version_path
from loragate.registry.rules.live import LiveStats
from tests import test_approvals
from tests.support.fleet import SUPPORT_PROMPT, admin_client
from tests.test_approvals import NAME

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "infra" / "vllm_plugin"
if str(PLUGIN_DIR) not in sys.path:
    sys.path.insert(0, str(PLUGIN_DIR))
import loragate_resolver  # noqa: E402
from loragate_resolver import registry_reader, request_ids  # noqa: E402

# test_approvals' fixture: a version on canary, its window ready, its sign-off pending
signoff = test_approvals.signoff

ADMIN = "x-loragate-admin-key"


def _key(replica) -> str:
    return (replica.secrets_dir / ADMIN_KEY_FILE).read_text()


def _feedback_key(replica) -> str:
    return (replica.secrets_dir / FEEDBACK_KEY_FILE).read_text()


def _ask(replica, name: str, user: str, max_tokens: int = 1) -> httpx.Response:
    body = {"model": name, "prompt": SUPPORT_PROMPT, "max_tokens": max_tokens, "temperature": 0, "user": user}
    return httpx.post(replica.url + "/v1/completions", json=body, timeout=60)


def _push_routes(replica) -> dict:
    answered = httpx.post(replica.url + "/loragate/routes", json={}, headers={ADMIN: _key(replica)}, timeout=30)
    assert answered.status_code == 200, answered.text
    return answered.json()["routes"]


def _figures(replica) -> dict:
    answered = httpx.get(replica.url + "/loragate/traffic", headers={ADMIN: _key(replica)}, timeout=30)
    assert answered.status_code == 200
    return answered.json()


def _set_share(registry, name: str, version: str, share: float) -> int:
    window, _ = registry.open_canary_window(version)
    if hasattr(registry, "set_canary_share"):
        registry.set_canary_share(name, share)
    else:  # before the registry could change a running window's share
        engine = create_engine(registry.settings.database_url)
        with engine.begin() as conn:
            conn.execute(text("UPDATE canary_windows SET share = :s WHERE id = :i"), {"s": share, "i": window.id})
        engine.dispose()
    return window.id


@pytest.fixture
def live(fleet):
    """v1 in production on every replica; v2 the canary (on the canary replica)."""
    fleet.promote(fleet.v1, "canary")
    fleet.promote(fleet.v1, "production")
    fleet.promote(fleet.v2, "canary")
    return fleet


@pytest.fixture
def faults(live):
    replica = live.replicas["prod-a"]
    yield replica.faults_file
    replica.faults_file.write_text("{}")


@pytest.mark.slow
def test_every_answer_names_its_version_and_only_the_fleet_can_name_one(live):
    replica = live.replicas["prod-a"]
    assert _push_routes(replica)[live.name] == {"production": live.v1, "window": None, "canary": None, "share": 0.0}
    answered = _ask(replica, live.name, "alice")
    assert answered.status_code == 200 and answered.headers["x-loragate-version"] == live.v1
    assert "x-loragate-fallback" not in answered.headers
    found = request_ids.verify(_feedback_key(replica), answered.headers["x-loragate-request-id"])
    assert found is not None and (found.adapter, found.version) == (live.name, live.v1)
    assert request_ids.verify(_key(replica), answered.headers["x-loragate-request-id"]) is None
    # a client may never pick a version, not even production's
    refused = _ask(replica, f"{live.name}@{live.v1}", "alice")
    assert refused.status_code == 404 and refused.json()["error"]["code"] == 404
    # the figures need the fleet's key; the feedback needs only the sealed id, counted once
    # here, and once across the fleet however many replicas it is replayed to
    assert httpx.get(replica.url + "/loragate/traffic").status_code == 401
    assert httpx.post(replica.url + "/loragate/routes", json={}).status_code == 401
    feedback = {"request_id": answered.headers["x-loragate-request-id"], "outcome": "accepted"}
    counted = [httpx.post(replica.url + "/loragate/feedback", json=feedback).json()["counted"] for _ in range(2)]
    assert counted == [True, False]
    other = live.replicas["prod-b"]
    assert httpx.post(other.url + "/loragate/feedback", json=feedback).json()["counted"] is True
    documents = [{**_figures(r), "replica": r.url} for r in (replica, other)]
    assert LiveStats.from_replicas(documents, live.name, None, "none", live.v1).production.accepted == 1
    for key in ("not-the-key", _key(replica)):  # the admin key the fleet pools hold seals nothing
        forged = {**feedback, "request_id": request_ids.sign(key, live.name, live.v1, None)}
        assert httpx.post(replica.url + "/loragate/feedback", json=forged).status_code == 400
    mine = [v for v in _figures(replica)["versions"] if v["adapter"] == live.name]
    assert [(v["version"], v["requests"], v["accepted"], v["breaker"]) for v in mine] == [(live.v1, 1, 1, "closed")]
    # a whole answer has a latency; a first token is a stream's
    assert (len(mine[0]["latency_ms"]), len(mine[0]["ttft_ms"])) == (1, 0)
    metrics = httpx.get(replica.url + "/metrics", headers={ADMIN: _key(replica)}).text
    assert f'loragate_requests_total{{adapter="{live.name}",outcome="ok",version="{live.v1}"}}' in metrics
    assert "loragate_request_seconds_bucket" in metrics
    # a keyless client of the port reads no tenant's name or version in either (keyless_reads)
    keyless = httpx.get(replica.url + "/metrics").text
    assert "vllm:" in keyless and live.name not in keyless and live.v1 not in keyless
    assert "/tiny-llama/" not in keyless
    models = httpx.get(replica.url + "/v1/models").json()["data"]
    assert [m["parent"] for m in models] == [None]
    keyed = httpx.get(replica.url + "/v1/models", headers={ADMIN: _key(replica)}).json()["data"]
    assert live.name in {m["id"] for m in keyed}


@pytest.mark.slow
def test_the_canarys_share_of_users_gets_the_canary_sticky_per_user(live):
    replica = live.replicas["prod-a"]
    window = _set_share(live.registry, live.name, live.v2, 0.5)
    assert _push_routes(replica)[live.name] == {
        "production": live.v1,
        "window": window,
        "canary": live.v2,
        "share": 0.5,
    }
    seen: dict[str, set[str]] = {}
    for _ in range(2):
        for user in (f"user-{i}" for i in range(12)):
            answered = _ask(replica, live.name, user)
            assert answered.status_code == 200 and "x-loragate-fallback" not in answered.headers
            seen.setdefault(user, set()).add(answered.headers["x-loragate-version"])
    assert all(len(versions) == 1 for versions in seen.values())
    assert set().union(*seen.values()) == {live.v1, live.v2}
    # the canary answers as the canary: the same text the fleet gets from the version itself
    canary_user = next(u for u, v in seen.items() if v == {live.v2})
    as_user = _ask(replica, live.name, canary_user, 16).json()["choices"][0]["text"]
    with admin_client(live.registry, replica.url) as fleet_client:
        assert as_user == fleet_client.complete(f"{live.name}@{live.v2}", SUPPORT_PROMPT, 16, admin=True).text
    mine = {v["version"]: v for v in _figures(replica)["versions"] if v["adapter"] == live.name}
    assert {v["window"] for v in mine.values()} == {window}


@pytest.mark.slow
def test_a_users_requests_on_both_replicas_are_one_unit_of_the_windows_figures(live):
    """The split randomises users, so the verdict counts them (``rules/units.py``): each
    replica keeps its share of a user's requests under the same keyed hash, and the reader
    merges the two into one unit per user, which names no user."""
    window = _set_share(live.registry, live.name, live.v2, 0.5)
    replicas = [live.replicas["prod-a"], live.replicas["prod-b"]]
    for replica in replicas:
        _push_routes(replica)
    users = [f"unit-user-{i}" for i in range(4)]
    for turn in range(4):
        for user in users:
            assert _ask(replicas[turn % 2], live.name, user).status_code == 200
    documents = [{**_figures(r), "replica": r.url} for r in replicas]
    assert not any(user in json.dumps(documents) for user in users)
    stats = LiveStats.from_replicas(documents, live.name, window, live.v2, live.v1)
    units = [*stats.canary.units.counts.values(), *stats.production.units.counts.values()]
    assert sorted(units) == [(4, 0)] * 4
    assert stats.canary.requests + stats.production.requests == 16


@pytest.mark.slow
def test_a_version_whose_copy_fails_verification_is_answered_by_the_next_with_the_fallback_header(live):
    replica = live.replicas["prod-a"]
    _set_share(live.registry, live.name, live.v2, 1.0)
    _push_routes(replica)
    canary_weights = Path(version_path(str(replica.adapter_dir), live.name, live.v2)) / "adapter_model.safetensors"
    production_weights = Path(version_path(str(replica.adapter_dir), live.name, live.v1)) / "adapter_model.safetensors"
    flip_a_byte(canary_weights)
    flipped = [canary_weights]
    try:
        answered = _ask(replica, live.name, "bob")
        assert answered.status_code == 200
        assert (answered.headers["x-loragate-version"], answered.headers["x-loragate-fallback"]) == (
            live.v1,
            "canary_failed:404",
        )
        # production's copy fails too once it must be loaded again: the base answers
        flip_a_byte(production_weights)
        flipped.append(production_weights)
        with admin_client(live.registry, replica.url) as fleet_client:
            fleet_client.unload(live.name)
        answered = _ask(replica, live.name, "bob")
        assert answered.status_code == 200 and answered.headers["x-loragate-version"] == "base"
        assert answered.headers["x-loragate-fallback"] == "canary_failed:404"
    finally:
        for weights in flipped:  # flipped back: the same byte again
            flip_a_byte(weights)
    # the copies mended, each version answers again
    answered = _ask(replica, live.name, "bob")
    assert (answered.headers["x-loragate-version"], answered.headers.get("x-loragate-fallback")) == (live.v2, None)
    canary = next(v for v in _figures(replica)["versions"] if v["version"] == live.v2)
    # charged once: the second failure production shared (the base answered) is no version's
    assert (canary["requests"], canary["errors"], canary["fallbacks"]) == (3, 1, 2)


@pytest.mark.slow
def test_injected_errors_trip_the_breaker_and_it_closes_again_after_the_cooldown(live, faults):
    replica = live.replicas["prod-a"]
    _set_share(live.registry, live.name, live.v2, 1.0)
    _push_routes(replica)
    faults.write_text(json.dumps({live.v2: {"error": True}, "breaker": {"errors": 2, "cooldown_s": 1}}))
    reasons = [_ask(replica, live.name, "carol").headers["x-loragate-fallback"] for _ in range(3)]
    assert reasons == ["canary_failed:500", "canary_failed:500", "breaker_open"]
    figures = _figures(replica)
    canary = next(v for v in figures["versions"] if v["version"] == live.v2)
    assert (canary["breaker"], canary["trips"]) == ("open", 1)
    assert [(a["kind"], a["version"]) for a in figures["alerts"] if a["adapter"] == live.name] == [
        ("breaker_open", live.v2)
    ]
    # the fault gone and the cooldown over, one request probes and closes the breaker
    faults.write_text(json.dumps({"breaker": {"errors": 2, "cooldown_s": 1}}))
    time.sleep(1.2)
    answered = _ask(replica, live.name, "carol")
    assert (answered.headers["x-loragate-version"], answered.headers.get("x-loragate-fallback")) == (live.v2, None)
    canary = next(v for v in _figures(replica)["versions"] if v["version"] == live.v2)
    assert (canary["breaker"], canary["trips"]) == ("closed", 1)


# -- the registry reader, outside vLLM (SQLite and Postgres) ----------------------------------


def test_the_reader_reads_the_active_windows_share_and_serves_a_qualified_name_only_as_its_adapters_own_version(
    signoff, tmp_path
):
    owner, v1, v2 = signoff.owner, signoff.v1, signoff.v2  # v1 on canary, its window active; v2 validated
    secrets = str(
        write_replica_secrets(tmp_path / "secrets", "k" * 32, replica_registry_url(owner.settings.database_url))
    )
    if hasattr(owner, "set_canary_share"):
        owner.set_canary_share(NAME, 0.25)
    production, windows = registry_reader.routes(secrets)
    assert production == [] and [w[:3] for w in windows] == [(signoff.window_id, NAME, v1)]
    assert windows[0][3] == pytest.approx(0.25 if hasattr(owner, "set_canary_share") else 0.0)
    adapters = tmp_path / "adapters"
    path = version_path(str(adapters), NAME, v1)
    owner.materialize(v1, Path(path))
    expect = loragate_resolver.registry_expectations("production", secrets)
    # production serves the canary under its qualified name while its window is active ...
    assert loragate_resolver.lookup(str(adapters), "production", f"{NAME}@{v1}", expect) == (v1, path)
    assert loragate_resolver.lookup(str(adapters), "production", NAME, expect) is None  # no index entry
    for name, version, code in [
        (f"{NAME}@{v2}", v2, "not_permitted"),  # ... not a version without one
        (f"{NAME}@{v2}", v1, "wrong_version"),  # the name says which version
        (f"acme/tiny-llama/other@{v1}", v1, "wrong_adapter"),  # only the adapter's own
    ]:
        with pytest.raises(registry_reader.NotServable) as refused:
            registry_reader.expected_files(secrets, "production", name, version)
        assert refused.value.code == code
    flip_a_byte(Path(path) / "adapter_model.safetensors")
    assert loragate_resolver.lookup(str(adapters), "production", f"{NAME}@{v1}", expect) is None
    flip_a_byte(Path(path) / "adapter_model.safetensors")
    owner.close_canary_window(signoff.window_id, WindowStatus.ROLLED_BACK, "withdrawn")
    assert registry_reader.routes(secrets)[1] == []
    with pytest.raises(registry_reader.NotServable):
        registry_reader.expected_files(secrets, "production", f"{NAME}@{v1}", v1)
