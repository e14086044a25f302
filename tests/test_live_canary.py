"""The canary gate on live traffic, end to end on the session's real vLLM replicas.

``deploy_canary`` warms the canary on both production replicas as ``name@version`` --
loaded, its bytes checked by the replica, its golden answers compared -- and only then gives
it its share; users of either replica stick to one version. A canary whose live answers fail
is rolled back on the live figures alone while every probe passes, and its users are
answered by production with the fallback header, then by production alone. A window over
with too few live requests is undecided and withdrawn; a tenant of twenty users ramps within
its cap first, then ends undecided with what was missing. After a promotion the replaced version stays
warm, so a rollback moves traffic and is confirmed per replica by the version header -- no
reload, no golden completions behind user traffic.

Latency is not what these tests are about (two cores, three replicas): the slack is wide;
the latency rules are tests/test_live_verdict.py's and tests/test_probe_verdict.py's tables.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import httpx
import pytest

from loragate.registry.render.canary import canary_evidence_markdown
from loragate.registry.rules.canary import Verdict, WindowStatus
from loragate.registry.rules.fleet import qualified_name, version_path
from loragate.registry.rules.live import LiveStats
from loragate.tasks.canary import observe_window
from loragate.tasks.canary_moves import deploy_canary, promote_canary, withdraw_canary
from loragate.tasks.fleet import rollback_and_switch
from loragate.tasks.live_figures import read_live_figures
from loragate.tasks.reconcile import fleet_status
from loragate.tasks.traffic import check_feedback, send_feedback
from tests.support.fleet import SUPPORT_PROMPT, admin_client, make_fleet

pytestmark = pytest.mark.slow

# a fixed set of users: the split is a hash of the window and the user, so who gets the
# canary is decided, not drawn -- each test counts what its users got
USERS = [f"user-{i}" for i in range(48)]


def completion(name: str, user: str, max_tokens: int = 1) -> dict:
    # ignore_eos: an answer of max_tokens tokens, long enough to have a time per token
    return {"model": name, "prompt": SUPPORT_PROMPT, "max_tokens": max_tokens, "temperature": 0, "user": user,
            "ignore_eos": True}  # fmt: skip


def ask(replica, name: str, user: str, max_tokens: int = 1) -> httpx.Response:
    answered = httpx.post(replica.url + "/v1/completions", json=completion(name, user, max_tokens), timeout=60)
    assert answered.status_code == 200, answered.text  # a user never sees an error they did not cause
    return answered


def trickled(replica, name: str, user: str, seconds: float, max_tokens: int = 16) -> httpx.Response:
    """A request whose body arrives in six pieces over ``seconds``: a slow client, or one
    that wants the canary to look slow."""
    body = json.dumps(completion(name, user, max_tokens)).encode()
    step = -(-len(body) // 6)

    def pieces():
        for start in range(0, len(body), step):
            time.sleep(seconds / 6)
            yield body[start : start + step]

    headers = {"content-type": "application/json"}
    answered = httpx.post(replica.url + "/v1/completions", content=pieces(), headers=headers, timeout=60)
    assert answered.status_code == 200, answered.text
    return answered


def productions(fleet) -> list:
    return [r for r in fleet.replicas.values() if r.role == "production"]


def served(fleet, replica) -> dict[str, str]:
    with admin_client(fleet.registry, replica.url) as client:
        return client.served_adapters()


def assert_in_sync_on_production(fleet) -> None:
    """What the fleet reads agrees with the pointers: nothing for reconcile to do."""
    for state in fleet_status(fleet.registry):
        if state.replica.role.value == "production":
            assert not [a for a in state.actions if a.adapter == fleet.name], [a.describe() for a in state.actions]


@pytest.fixture
def live(tmp_path, replicas, replica_adapters, validated_adapters):
    """v1 in production; v2 deployed as the canary at a 50 % share, window of 1 s."""
    fleet = make_fleet(
        tmp_path,
        replicas,
        replica_adapters,
        validated_adapters,
        canary_share=0.5,
        canary_min_live_requests=10,
        # the count a verdict needs is tests/test_undecided.py's (and few_users' below): here,
        # the minimum alone, which a few dozen users reach
        canary_detect_ratio=0.0,
        canary_window_s=1,
        canary_p95_slack_ms=60_000,
    )
    fleet.promote(fleet.v1, "canary")
    fleet.promote(fleet.v1, "production")
    deployment = deploy_canary(fleet.registry, fleet.v2)
    yield fleet, deployment
    for replica in productions(fleet):
        replica.faults_file.write_text("{}")
    fleet.registry.close()


def test_the_canary_is_warm_and_verified_on_every_production_replica_before_users_get_it_and_users_stick(live):
    fleet, deployment = live
    assert deployment.window.share == 0.5
    warm = qualified_name(fleet.name, fleet.v2)
    for replica in productions(fleet):
        assert served(fleet, replica)[warm] == version_path(str(replica.adapter_dir), fleet.name, fleet.v2)
    warmed = [r for r in deployment.replicas if r.get("served_as") == warm]
    assert sorted(r["replica"] for r in warmed) == sorted(r.url for r in productions(fleet))
    assert all(r["verified"].endswith("golden outputs") for r in warmed)
    # opened dark, given its share only once warm: the audit log says so
    shares = [e for e in fleet.registry.history(fleet.name) if e.action == "canary_share"]
    assert [float(e.to_value or "nan") for e in shares] == [0.5]

    a, b = productions(fleet)
    got = {}
    for user in USERS:
        versions = {
            ask(a, fleet.name, user).headers["x-loragate-version"],
            ask(b, fleet.name, user).headers["x-loragate-version"],
        }
        assert len(versions) == 1, f"{user} got {versions} from two replicas"
        got[user] = versions.pop()
    assert set(got.values()) == {fleet.v1, fleet.v2}
    # and a client still cannot pick the canary by its qualified name
    body = {"model": warm, "prompt": SUPPORT_PROMPT, "max_tokens": 1}
    assert httpx.post(a.url + "/v1/completions", json=body, timeout=60).status_code == 404


def test_a_canary_failing_live_requests_is_rolled_back_on_live_figures_while_every_probe_passes(live):
    fleet, deployment = live
    for replica in productions(fleet):
        # many errors, never a trip: the live error test decides here, not the breaker
        replica.faults_file.write_text(json.dumps({fleet.v2: {"error": True}, "breaker": {"errors": 10_000}}))
    fallbacks = 0
    for user in USERS:
        for replica in productions(fleet):
            answered = ask(replica, fleet.name, user)
            assert answered.headers["x-loragate-version"] == fleet.v1
            fallbacks += "x-loragate-fallback" in answered.headers
    assert fallbacks > 10

    observation, _ = observe_window(fleet.registry, deployment.window)

    assert observation.verdict == Verdict.ROLLBACK
    probe_monitors = {m.name: m for m in observation.monitors}
    assert probe_monitors["error_rate"].in_band and probe_monitors["golden_drift"].in_band
    assert observation.canary.errors == 0 and observation.drift == 0.0
    assert any("live_error_rate" in r for r in observation.reasons), observation.reasons
    stored = fleet.registry.canary_observations(deployment.window.id)[-1]
    assert stored.live is not None and stored.live["stats"]["canary"]["errors"] > 0

    window = withdraw_canary(fleet.registry, deployment.window, "live errors")
    assert window.status == WindowStatus.ROLLED_BACK and window.share == 0.0
    for replica in productions(fleet):
        assert qualified_name(fleet.name, fleet.v2) not in served(fleet, replica)
        for user in USERS[:8]:
            answered = ask(replica, fleet.name, user)
            assert answered.headers["x-loragate-version"] == fleet.v1
            assert "x-loragate-fallback" not in answered.headers


def test_a_fault_every_version_shares_rolls_back_nothing_and_raises_the_replicas_fallback_alert(live):
    fleet, deployment = live
    for replica in productions(fleet):
        # overload, an engine restart: every version fails the same requests; the base answers
        faults = {fleet.v1: {"error": True}, fleet.v2: {"error": True}, "breaker": {"errors": 10_000}}
        replica.faults_file.write_text(json.dumps(faults))
    for user in USERS:
        for replica in productions(fleet):
            assert ask(replica, fleet.name, user).headers["x-loragate-version"] == "base"

    observation, alerts = observe_window(fleet.registry, deployment.window)

    assert observation.verdict != Verdict.ROLLBACK, observation.reasons
    assert observation.live is not None and observation.live["stats"]["canary"]["errors"] == 0
    assert observation.live["stats"]["canary"]["fallbacks"] > 0  # its users got the base, and it shows
    assert {a.kind for a in alerts} == {"fallback_rate"}, [a.as_dict() for a in alerts]


def test_bodies_trickled_into_the_canarys_bucket_trip_no_breaker_and_are_in_no_versions_latency(live):
    """The slow breaker trips on answers 3x slower per token than production's p99: a clock
    that started before the body was read let a client trickle three bodies in and open the
    canary's breaker. The engine's clock starts once the body is complete."""
    fleet, deployment = live
    a, _ = productions(fleet)
    answered_by = {u: ask(a, fleet.name, u, max_tokens=16).headers["x-loragate-version"] for u in USERS}
    canary_users = [u for u, version in answered_by.items() if version == fleet.v2][:5]
    assert len(canary_users) == 5
    for user in canary_users:
        assert trickled(a, fleet.name, user, seconds=3.0).headers["x-loragate-version"] == fleet.v2

    read = read_live_figures(fleet.registry, [fleet.name]).of(fleet.name)
    documents, unreadable = read.documents, read.unreadable
    assert not unreadable
    figures = LiveStats.from_replicas(documents, fleet.name, deployment.window.id, fleet.v2, fleet.v1)
    assert figures.canary_trips == 0 and not figures.canary.breaker_open
    on_canary = sum(version == fleet.v2 for version in answered_by.values())
    assert figures.canary.requests == on_canary + len(canary_users) and figures.canary.ms_per_token
    assert max(figures.canary.latency_ms) < 3000  # three seconds of trickle in none of them


def test_a_window_over_with_too_few_live_requests_is_undecided_and_withdrawn_leaving_no_user_on_it(live):
    fleet, deployment = live
    time.sleep(1.1)  # the window's length is over: only live traffic is missing
    a, _ = productions(fleet)
    ask(a, fleet.name, USERS[0])

    observation, _ = observe_window(fleet.registry, deployment.window)
    assert observation.verdict == Verdict.UNDECIDED, observation.reasons
    assert observation.reasons[0] == "window over undecided: its live traffic could not decide it"
    assert any("of 10 requests needed" in r for r in observation.reasons), observation.reasons
    closed = withdraw_canary(fleet.registry, deployment.window, "canary undecided: too few")
    assert closed.status == WindowStatus.UNDECIDED and fleet.registry.get_adapter(fleet.name).canary is None
    for user in USERS:
        for replica in productions(fleet):
            assert ask(replica, fleet.name, user).headers["x-loragate-version"] == fleet.v1


@pytest.fixture
def few_users(tmp_path, replicas, replica_adapters, validated_adapters):
    """v1 in production; v2 deployed as the canary at 1 %, its window of 10 minutes sized to
    catch errors 2x production's (thousands of requests), the split allowed to ramp to 10 %.
    The test moves the evaluation's clock -- a minute in, then past the end -- instead of
    waiting: a short window on a busy host could be over before its first evaluation, and
    one evaluated too soon has no pace to project."""
    fleet = make_fleet(
        tmp_path,
        replicas,
        replica_adapters,
        validated_adapters,
        canary_share=0.01,
        canary_max_auto_share=0.10,
        canary_detect_ratio=2.0,
        canary_window_s=600,
        canary_p95_slack_ms=60_000,
    )
    fleet.promote(fleet.v1, "canary")
    fleet.promote(fleet.v1, "production")
    deployment = deploy_canary(fleet.registry, fleet.v2)
    yield fleet, deployment
    fleet.registry.close()


def test_a_tenant_of_twenty_users_ramps_within_the_cap_then_ends_undecided_with_what_was_missing(
    few_users, monkeypatch
):
    fleet, deployment = few_users
    a, b = productions(fleet)
    answered_by = [ask(a, fleet.name, user).headers["x-loragate-version"] for user in USERS[:20]]
    # the evaluation's clock a minute into the window: past the 2 % a projection needs, however
    # fast this host got here (the ramp reads its own module's clock)
    minute_in = deployment.window.opened_at + timedelta(seconds=60)
    for module in ("loragate.tasks.canary", "loragate.tasks.canary_moves"):
        monkeypatch.setattr(f"{module}.utcnow", lambda: minute_in)
    observation, _ = observe_window(fleet.registry, deployment.window)
    assert observation.verdict == Verdict.CONTINUE, observation.reasons
    ramped = fleet.registry.canary_window(deployment.window.id)
    assert ramped.share == 0.10  # thousands needed, twenty users: straight to the cap, no further
    (step,) = [
        e for e in fleet.registry.history(fleet.name) if e.action == "canary_share" and "auto-ramp" in (e.reason or "")
    ]
    assert "auto-ramp 1.00% -> 10.00% (cap 10.00%)" in (step.reason or "")
    answered_by += [ask(r, fleet.name, u).headers["x-loragate-version"] for u in USERS[:20] for r in (a, b)]
    over = ramped.ends_at + timedelta(seconds=1)
    for module in ("loragate.tasks.canary", "loragate.tasks.canary_moves"):
        monkeypatch.setattr(f"{module}.utcnow", lambda: over)  # the window's length is over

    observation, _ = observe_window(fleet.registry, ramped)
    assert observation.verdict == Verdict.UNDECIDED, observation.reasons
    assert fleet.registry.canary_window(ramped.id).share == 0.10  # never past the cap
    needed = observation.live["coverage"]
    assert needed["needed"] > 1000 and needed["canary_requests"] == answered_by.count(fleet.v2) and not needed["met"]
    assert any("canary requests needed to catch errors 2x production's at 80% power" in r for r in observation.reasons)
    closed = withdraw_canary(fleet.registry, ramped, "canary undecided: " + "; ".join(observation.reasons))
    shown = canary_evidence_markdown(closed, fleet.registry.canary_observations(ramped.id))
    assert "**Undecided:**" in shown and f"of {needed['needed']} needed" in shown


def test_rolling_back_a_promotion_moves_users_to_the_warm_previous_version_confirmed_per_replica(live):
    fleet, deployment = live
    time.sleep(1.1)
    for user in USERS:
        for replica in productions(fleet):
            ask(replica, fleet.name, user)
    observation, _ = observe_window(fleet.registry, deployment.window)
    assert observation.verdict == Verdict.READY, observation.reasons
    window, previous, _ = promote_canary(fleet.registry, fleet.v2, "signed off")
    assert window.status == WindowStatus.PROMOTED and previous == fleet.v1
    for replica in productions(fleet):
        paths = served(fleet, replica)
        assert paths[qualified_name(fleet.name, fleet.v1)] == version_path(
            str(replica.adapter_dir), fleet.name, fleet.v1
        )
        assert ask(replica, fleet.name, USERS[0]).headers["x-loragate-version"] == fleet.v2
    # the canary was warm: the promotion moved users, and what the fleet reads agrees (the
    # pipeline's verify step after a promotion)
    assert_in_sync_on_production(fleet)

    plan, report = rollback_and_switch(fleet.registry, fleet.name, "production", reason="bad answers")

    assert plan.audit_to == fleet.v1
    moved = {row["replica"]: row for row in report}
    for replica in productions(fleet):
        assert moved[replica.url]["verified"] == "warm: a routing change"
        assert moved[replica.url]["confirmed_s"] is not None
        for user in USERS[:8]:
            assert ask(replica, fleet.name, user).headers["x-loragate-version"] == fleet.v1
    assert_in_sync_on_production(fleet)


def test_feedback_reaches_a_production_replica_and_bad_feedback_is_refused_before_anything(live):
    fleet, _ = live
    answered = ask(productions(fleet)[0], fleet.name, USERS[1])
    request_id = answered.headers["x-loragate-request-id"]
    first = send_feedback(fleet.registry, request_id, "accepted")
    assert first["counted"] is True and first["adapter"] == fleet.name
    assert first["version"] == answered.headers["x-loragate-version"]
    from loragate.registry.errors import InvalidInput

    for bad_id, outcome, field in ((request_id, "maybe", "outcome"), ("not-an-id", "accepted", "request_id")):
        with pytest.raises(InvalidInput) as refused:
            check_feedback(bad_id, outcome)
        assert refused.value.field == field


def _shell(fleet, monkeypatch, capsys, role: str, *argv: str) -> dict:
    """``loragate ARGV --json`` with a token of ``role``, on the fleet's settings."""
    from loragate.cli.main import main

    settings = fleet.registry.settings
    for variable, value in {
        "LORAGATE_HOME": str(settings.home),
        "LORAGATE_DATABASE_URL": settings.database_url,
        "LORAGATE_ARTIFACTS": settings.artifacts,
        "LORAGATE_CANARY_SHARE": "0.5",
    }.items():
        monkeypatch.setenv(variable, value)
    monkeypatch.setenv("LORAGATE_TOKEN", fleet.registry.create_token(role, f"shell-{role}")[1])
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_the_shell_opens_a_canary_as_the_gate_does_and_withdraws_it_as_the_watch_does(
    tmp_path, replicas, replica_adapters, validated_adapters, monkeypatch, capsys
):
    """``loragate promote --to canary`` once moved the pointer alone (no window, no split: never
    evaluated on live traffic), and ``loragate rollback --stage canary`` left the window open
    at its share: users kept getting the withdrawn canary after the command returned."""
    fleet = make_fleet(tmp_path, replicas, replica_adapters, validated_adapters, canary_p95_slack_ms=60_000)
    try:
        fleet.promote(fleet.v1, "canary")
        fleet.promote(fleet.v1, "production")

        opened = _shell(fleet, monkeypatch, capsys, "signing", "promote", fleet.v2, "--to", "canary")

        window = fleet.registry.active_canary_window(fleet.name)
        assert window is not None and window.version_id == fleet.v2 and window.share == 0.5
        assert opened["window"] == {"id": window.id, "status": window.status.value, "share": 0.5}
        before = {user: ask(productions(fleet)[0], fleet.name, user).headers["x-loragate-version"] for user in USERS}
        assert set(before.values()) == {fleet.v1, fleet.v2}  # the split is live: the watch has figures to judge

        withdrawn = _shell(fleet, monkeypatch, capsys, "activation", "rollback", fleet.name, "--stage", "canary")

        assert withdrawn["window"]["status"] == WindowStatus.ROLLED_BACK.value
        for replica in productions(fleet):
            assert {ask(replica, fleet.name, user).headers["x-loragate-version"] for user in USERS} == {fleet.v1}
            assert qualified_name(fleet.name, fleet.v2) not in served(fleet, replica)  # its warm copy is gone
        assert fleet.registry.get_version(fleet.v2).stage.value == "rolled_back"
        assert fleet.registry.active_canary_window(fleet.name) is None
        assert_in_sync_on_production(fleet)
    finally:
        fleet.registry.close()
