"""A canary window's share of live requests, and traffic alerts as audit records, on SQLite
and Postgres: a window opens with the configured share; a change is a compare-and-set,
audited with what it replaced, a no-op when equal, refused for anything but a finite number
in [0, 1] or for a closed window (nothing changed); two changes racing end consistent. An
alert is recorded once per adapter, kind, version and replica in 15 minutes, even when two
recorders race, and ``loragate status`` lists it. The CLI: ``canary share`` exits 0, or 2
with one line naming ``share``, or 3 above the cap (``share_above_cap``).
"""

from __future__ import annotations

import json
import math
import os
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import insert, select

from loragate.registry.db.schema import audit_events, canary_windows
from loragate.registry.errors import ErrorCode, IllegalTransition, InvalidInput, NotFound
from loragate.registry.rules.canary import WindowStatus
from loragate.registry.rules.share import parse_share
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from tests.support.commands import cli_runner
from tests.support.moves import promote
from tests.support.races import released_at_once
from tests.support.registries import IN_PROCESS, audit_count, mark_validated, sql_engine

NAME = "acme/tiny-llama/support"
CONFIGURED = 0.2
REPLICA = "http://127.0.0.1:8101"


@pytest.fixture
def settings(tmp_path, db_url) -> Settings:
    """The suite's settings with a canary share of its own (not the 1 % default)."""
    return Settings(
        home=tmp_path / "home",
        database_url=db_url,
        artifacts=str(tmp_path / "artifacts"),
        actor="tester",
        canary_share=CONFIGURED,
    )


@pytest.fixture
def canaried(cataloged, seeded_bundles) -> tuple[Registry, str]:
    """A validated version of NAME on canary, no window yet."""
    registry, _ = cataloged
    v1 = registry.register_adapter(seeded_bundles[0], NAME).version.version_id
    mark_validated(registry, v1)
    promote(registry, v1, "canary")
    return registry, v1


def stored_share(registry: Registry, window_id: int) -> float:
    engine = sql_engine(registry)
    try:
        with engine.connect() as conn:
            return conn.execute(select(canary_windows.c.share).where(canary_windows.c.id == window_id)).scalar_one()
    finally:
        engine.dispose()


def share_events(registry: Registry) -> list:
    return [e for e in registry.history(NAME) if e.action == "canary_share"]


# -- opening and changing a share ------------------------------------------------------------


@pytest.mark.parametrize(("given", "kept"), [(None, CONFIGURED), (0.0, 0.0), (0.5, 0.5), (1.0, 1.0)])
def test_a_window_opens_with_the_share_given_else_the_configured_one(canaried, given, kept):
    registry, v1 = canaried
    window, created = registry.open_canary_window(v1, share=given)
    assert created and window.share == kept
    assert stored_share(registry, window.id) == kept
    assert registry.active_canary_window(NAME) == window
    (opened,) = [e for e in registry.history(NAME) if e.action == "canary_window" and e.to_value == "open"]
    assert opened.details["share"] == kept


def test_opening_the_active_window_again_keeps_its_share(canaried):
    registry, v1 = canaried
    window, _ = registry.open_canary_window(v1, share=0.3)
    again, created = registry.open_canary_window(v1, share=0.9)
    assert not created and again.id == window.id and again.share == 0.3


def test_a_share_change_is_kept_and_audited_with_what_it_replaced(canaried):
    registry, v1 = canaried
    window, _ = registry.open_canary_window(v1)
    changed = registry.set_canary_share(NAME, 0.1, reason="more traffic")
    assert (changed.id, changed.share) == (window.id, 0.1)
    assert stored_share(registry, window.id) == 0.1 and registry.canary_window(window.id).share == 0.1
    (event,) = share_events(registry)
    assert (event.version_id, event.stage, event.actor, event.reason) == (v1, "canary", "tester", "more traffic")
    assert event.details == {"window_id": window.id, "from": CONFIGURED, "to": 0.1, "reason": "more traffic"}
    # by window id too
    assert registry.set_canary_share(window.id, 1.0).share == 1.0
    assert [(e.details["from"], e.details["to"]) for e in share_events(registry)] == [(CONFIGURED, 0.1), (0.1, 1.0)]


def test_the_same_share_again_changes_and_audits_nothing(canaried):
    registry, v1 = canaried
    window, _ = registry.open_canary_window(v1)
    before = audit_count(registry)
    assert registry.set_canary_share(NAME, CONFIGURED).share == CONFIGURED
    assert audit_count(registry) == before and share_events(registry) == []


NOT_SHARES = [-0.01, 1.0001, 2, math.nan, math.inf, -math.inf, True, "0.5", None]


@pytest.mark.parametrize("bad", NOT_SHARES, ids=[repr(b) for b in NOT_SHARES])
def test_a_share_that_is_not_a_number_from_zero_to_one_is_refused_and_changes_nothing(canaried, bad):
    registry, v1 = canaried
    with pytest.raises(InvalidInput) as refused_open:
        registry.open_canary_window(v1, share=bad) if bad is not None else registry.open_canary_window(v1, share=-1)
    assert (refused_open.value.code, refused_open.value.field) == (ErrorCode.INVALID_SHARE, "share")
    assert registry.active_canary_window(NAME) is None
    window, _ = registry.open_canary_window(v1)
    before = audit_count(registry)
    with pytest.raises(InvalidInput) as refused:
        registry.set_canary_share(NAME, bad)
    assert (refused.value.code, refused.value.field) == (ErrorCode.INVALID_SHARE, "share")
    assert "share" in refused.value.one_line() and "\n" not in refused.value.one_line()
    assert stored_share(registry, window.id) == CONFIGURED and audit_count(registry) == before


def test_a_closed_window_has_no_share_to_change(canaried):
    registry, v1 = canaried
    window, _ = registry.open_canary_window(v1)
    registry.close_canary_window(window.id, WindowStatus.ROLLED_BACK, "test")
    before = audit_count(registry)
    with pytest.raises(IllegalTransition):
        registry.set_canary_share(window.id, 0.5)
    with pytest.raises(NotFound) as none:
        registry.set_canary_share(NAME, 0.5)
    assert none.value.field == "name"
    with pytest.raises(NotFound):
        registry.set_canary_share(window.id + 1000, 0.5)
    assert stored_share(registry, window.id) == CONFIGURED and audit_count(registry) == before


def test_two_share_changes_racing_end_consistent(canaried):
    """Released at once, both apply, one after the other: the stored share is the later's,
    and the audit trail chains from the share the window opened with to the stored one."""
    registry, v1 = canaried
    window, _ = registry.open_canary_window(v1)
    shares = [0.3, 0.7]
    for _ in range(3):
        assert released_at_once([lambda s=s: registry.set_canary_share(NAME, s) for s in shares]) == []
        events = share_events(registry)
        chain = [(e.details["from"], e.details["to"]) for e in events]
        assert chain[0][0] == CONFIGURED and all(a[1] == b[0] for a, b in zip(chain, chain[1:], strict=False))
        assert chain[-1][1] == stored_share(registry, window.id) in shares
        shares.reverse()
    assert len(share_events(registry)) >= 4  # each round moved the share at least once past the other's


# -- traffic alerts ---------------------------------------------------------------------------


def alert(registry: Registry, kind: str = "breaker_open", version: str | None = "v1", replica: str = REPLICA) -> bool:
    return registry.record_traffic_alert(NAME, kind, {"version_id": version, "replica": replica, "detail": "5 errors"})


def test_an_alert_is_recorded_once_per_adapter_kind_version_and_replica_in_15_minutes(canaried):
    registry, _ = canaried
    since = datetime.now(UTC) - timedelta(seconds=1)
    assert alert(registry) is True
    assert alert(registry) is False  # the same again
    assert alert(registry, replica="http://127.0.0.1:8102") is True
    assert alert(registry, version="v2") is True
    assert alert(registry, kind="fallback_rate", version=None) is True
    assert alert(registry, kind="fallback_rate", version=None) is False
    listed = registry.traffic_alerts(since)
    assert [(a["kind"], a["version_id"], a["replica"]) for a in listed] == [
        ("breaker_open", "v1", REPLICA),
        ("breaker_open", "v1", "http://127.0.0.1:8102"),
        ("breaker_open", "v2", REPLICA),
        ("fallback_rate", None, REPLICA),
    ]
    assert {(a["name"], a["detail"], a["actor"]) for a in listed} == {(NAME, "5 errors", "tester")}
    assert registry.traffic_alerts(datetime.now(UTC) + timedelta(seconds=1)) == []


def recorded_before(registry: Registry, age: timedelta, details: dict) -> None:
    """A v1 breaker alert already in the audit log, recorded ``age`` ago."""
    engine = sql_engine(registry)
    try:
        with engine.begin() as conn:
            conn.execute(
                insert(audit_events).values(
                    at=datetime.now(UTC) - age,
                    actor="tester",
                    action="traffic_alert",
                    adapter_name=NAME,
                    version_id="v1",
                    to_value="breaker_open",
                    details=details,
                )
            )
    finally:
        engine.dispose()


def test_an_alert_older_than_15_minutes_is_recorded_again(canaried):
    registry, _ = canaried
    recorded_before(registry, timedelta(minutes=16), {"replica": REPLICA})
    assert alert(registry) is True
    assert alert(registry) is False


def trip(registry: Registry, occurrence: str, replica: str = REPLICA) -> bool:
    detail = {"version_id": "v1", "replica": replica, "detail": "5 errors", "occurrence": occurrence}
    return registry.record_traffic_alert(NAME, "breaker_open", detail)


def test_a_breaker_trip_is_recorded_once_ever_by_its_id_and_a_new_trip_at_once(canaried):
    """The replica keeps its last trips for days: each watch and evaluation sees the same old
    trip, which the 15-minute dedupe announced again every quarter of an hour."""
    registry, _ = canaried
    assert trip(registry, "boot1-1") is True
    assert trip(registry, "boot1-1") is False
    assert trip(registry, "boot1-2") is True  # the same version tripping again: news
    assert trip(registry, "boot1-1", replica="http://127.0.0.1:8102") is True  # another replica's own
    recorded_before(registry, timedelta(days=3), {"replica": REPLICA, "occurrence": "boot0-7"})
    assert trip(registry, "boot0-7") is False  # announced three days ago: not again


@pytest.mark.parametrize("occurrence", ["a\nb", "x" * 129])
def test_an_occurrence_that_is_not_one_short_line_is_refused_and_nothing_recorded(canaried, occurrence):
    registry, _ = canaried
    since = datetime.now(UTC) - timedelta(seconds=1)
    with pytest.raises(InvalidInput) as refused:
        trip(registry, occurrence)
    assert refused.value.field == "occurrence"
    assert registry.traffic_alerts(since) == []


def test_two_recorders_of_one_alert_racing_record_it_once(canaried):
    registry, _ = canaried
    for round_ in range(3):
        recorded: list[bool] = []

        def record(kind: str = f"race_{round_}", into: list[bool] = recorded) -> None:
            into.append(alert(registry, kind=kind))

        assert released_at_once([record] * 4) == []
        assert sorted(recorded) == [False, False, False, True]
    assert len(registry.traffic_alerts(datetime.now(UTC) - timedelta(minutes=1))) == 3


# -- parsing what a person writes ------------------------------------------------------------

WRITTEN = [("0.1", 0.1), ("10%", 0.1), (" 50% ", 0.5), ("100%", 1.0), ("0", 0.0), ("0%", 0.0), ("1", 1.0)]
NOT_WRITTEN = ["abc", "", "%", "110%", "-1%", "1.5", "-0.1", "nan", "inf", "nan%", "10%%", "0x1"]


@pytest.mark.parametrize(("text", "share"), WRITTEN)
def test_a_share_is_written_as_a_fraction_or_a_percentage(text, share):
    assert parse_share(text) == pytest.approx(share)


@pytest.mark.parametrize("text", NOT_WRITTEN)
def test_anything_else_written_is_refused_naming_share(text):
    with pytest.raises(InvalidInput) as refused:
        parse_share(text)
    assert (refused.value.code, refused.value.field) == (ErrorCode.INVALID_SHARE, "share")


# -- the CLI ---------------------------------------------------------------------------------


@pytest.fixture
def share_cli(tmp_path, tiny_base, seeded_bundles):
    """The real ``loragate`` on a fresh SQLite home whose adapter's canary has a window at the
    default share, run with a signing token; the registry in process, to look underneath."""
    home = tmp_path / "home"
    settings = Settings(home=home, artifacts=str(tmp_path / "artifacts"), database_url=f"sqlite:///{home / 'r.db'}")
    registry = Registry.open(settings, check_schema=False, principal=IN_PROCESS)
    registry.init()
    registry.add_base(str(tiny_base), "tiny-llama")
    v1 = registry.register_adapter(seeded_bundles[0], NAME).version.version_id
    mark_validated(registry, v1)
    promote(registry, v1, "canary")
    window, _ = registry.open_canary_window(v1)
    token = registry.create_token("signing", "share-tests")[1]
    env = {**os.environ, "LORAGATE_HOME": str(home), "LORAGATE_DATABASE_URL": settings.database_url}
    env.update({"LORAGATE_ARTIFACTS": settings.artifacts, "LORAGATE_TOKEN": token, "LORAGATE_ACTOR": "cli-test"})
    yield cli_runner(env, home), registry, window
    registry.close()


def test_the_cli_sets_a_share_written_as_a_percentage(share_cli):
    run, registry, window = share_cli
    done = run("canary", "share", NAME, "10%", "--reason", "ramp up")
    assert done.returncode == 0, done.stderr
    assert f"canary window {window.id}" in done.stdout and "10.00%" in done.stdout and "was 1.00%" in done.stdout
    assert stored_share(registry, window.id) == 0.1
    (event,) = share_events(registry)
    assert event.actor.startswith("share-tests ") and event.reason == "ramp up"
    shown = run("canary", "share", NAME, "0.25", "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["share"] == 0.25


@pytest.mark.parametrize("bad", ["150%", "abc", "nan", "-0.5", "1.01"])
def test_the_cli_refuses_a_bad_share_in_one_line_naming_it_and_changes_nothing(share_cli, bad):
    run, registry, window = share_cli
    before = audit_count(registry)
    refused = run("canary", "share", NAME, bad)
    assert refused.returncode == 2
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("error: invalid_share [share]:")
    assert stored_share(registry, window.id) == 0.01 and audit_count(registry) == before


@pytest.mark.parametrize("above", ["100%", "0.6"])
def test_the_cli_refuses_a_signing_token_a_share_above_the_cap_as_a_permission_and_changes_nothing(share_cli, above):
    """No person signed the canary off: a pipeline's signing token cannot send more than
    LORAGATE_CANARY_MAX_SHARE (50 %) of the users to it (tests/test_canary_share_cap.py)."""
    run, registry, window = share_cli
    before = audit_count(registry)
    refused = run("canary", "share", NAME, above)
    assert refused.returncode == 3
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("error: permission denied:") and "LORAGATE_CANARY_MAX_SHARE" in line
    shown = run("canary", "share", NAME, above, "--json")
    assert shown.returncode == 3
    assert json.loads(shown.stdout)["error"]["code"] == "share_above_cap"
    assert json.loads(shown.stdout)["error"]["field"] == "share"
    assert stored_share(registry, window.id) == 0.01 and audit_count(registry) == before


def test_loragate_status_lists_the_recent_traffic_alerts(share_cli):
    run, registry, _ = share_cli
    quiet = run("status", "--json")
    assert quiet.returncode == 0 and json.loads(quiet.stdout)["alerts"] == []
    assert "ALERT" not in run("status").stdout
    registry.record_traffic_alert(NAME, "breaker_open", {"version_id": "v9", "replica": REPLICA, "detail": "5\nerrors"})
    text = run("status").stdout
    (line,) = [x for x in text.splitlines() if x.startswith("ALERT")]
    assert line.startswith(f"ALERT\tbreaker_open\t{NAME}\tv9\ton {REPLICA}\tat ") and line.endswith(": 5 errors")
    (listed,) = json.loads(run("status", "--json").stdout)["alerts"]
    assert (listed["kind"], listed["name"], listed["version_id"], listed["replica"]) == (
        "breaker_open",
        NAME,
        "v9",
        REPLICA,
    )
