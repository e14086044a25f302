"""The canary verdict is the evaluator's (migration 0015), tried as each role's database user
writing raw SQL on Postgres.

The canary pool holds ``loragate_signing``; with it a window could be marked ``ready`` by
hand (an open window is the only kind the evaluation looks at: a failing canary left the
watch and was offered for sign-off), an observation inserted (the latest one's evidence
seeds the next look: an error test reset), a window superseded by one with laxer
thresholds. Now an observation and the moves it decides are written only through
``loragate_record_observation``, the evaluator's function, whose EXECUTE only
``loragate_activation`` (the evaluation's role) holds; a window a role's user opens takes
the thresholds ``loragate init`` wrote; and no role's user reads a window's bucket secret.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DBAPIError

from loragate.registry.db import migrate
from loragate.registry.db.store import make_engine
from loragate.registry.rules.canary import Observation, SideStats, Verdict, WindowStatus
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from loragate.tasks.canary import evaluation_plan
from tests.support.moves import promote
from tests.support.registries import IN_PROCESS, mark_validated

pytestmark = pytest.mark.postgres

NAME = "acme/tiny-llama/support"
ROLES = ("training", "signing", "activation", "admin", "fleet")
# what init writes into the database and every window a role's user opens is judged by
WINDOW_S = 1800
RECORD = text("SELECT observation_id, moved_to FROM public.loragate_record_observation(:w, CAST(:o AS jsonb), 'probe')")
SIDE = SideStats(20, 0, 50.0, 100.0)


@dataclass(frozen=True)
class Canary:
    url: str
    settings: Settings
    version_id: str
    window_id: int  # open, one CONTINUE observation by the evaluation


def as_user(url: str, role: str) -> Engine:
    return create_engine(make_url(url).set(username=f"loragate_{role}"))


def observation(window_id: int, verdict: Verdict, evidence: str = "evaluator") -> Observation:
    return Observation(window_id, datetime.now(UTC), SIDE, SIDE, 0.0, [], verdict, [], [evidence])


@pytest.fixture
def canary(pg_template, tiny_base, seeded_bundles, tmp_path) -> Canary:
    url = pg_template()
    settings = Settings(
        home=tmp_path / "home", database_url=url, artifacts=str(tmp_path / "artifacts"), canary_window_s=WINDOW_S
    )
    with Registry.open(settings, principal=IN_PROCESS) as owner:
        owner.init()
        owner.add_base(str(tiny_base), "tiny-llama")
        version = owner.register_adapter(seeded_bundles[0], NAME).version.version_id
        mark_validated(owner, version)
        promote(owner, version, "canary")
        window, _ = owner.open_canary_window(version)
    evaluating = settings.model_copy(update={"database_url": role_url(url, "activation")})
    with Registry.open(evaluating, principal=IN_PROCESS) as evaluator:
        evaluator.record_canary_observation(observation(window.id, Verdict.CONTINUE))
    return Canary(url, settings, version, window.id)


def role_url(url: str, role: str) -> str:
    return make_url(url).set(username=f"loragate_{role}").render_as_string(hide_password=False)


def run(engine: Engine, statement, params: dict, *, commit: bool = False) -> list:
    with engine.connect() as conn:
        try:
            result = conn.execute(statement, params)
            rows = result.all() if result.returns_rows else [result.rowcount]
            if commit:
                conn.commit()
            return rows
        finally:
            conn.rollback()


def refused(engine: Engine, statement, params: dict) -> str:
    with pytest.raises(DBAPIError) as failed:
        run(engine, statement, params, commit=True)
    assert getattr(failed.value.orig, "sqlstate", None) == "42501", failed.value
    return str(failed.value.orig)


def owner_reads(canary: Canary) -> Registry:
    return Registry.open(canary.settings, principal=IN_PROCESS)


def test_the_signing_user_cannot_mark_a_window_ready_and_the_evaluation_still_watches_it(canary):
    signing = as_user(canary.url, "signing")
    try:
        message = refused(
            signing, text("UPDATE canary_windows SET status = 'ready' WHERE id = :w"), {"w": canary.window_id}
        )
        assert "evaluator" in message
        refused(
            signing,
            text("UPDATE canary_windows SET status = 'undecided', closed_at = now() WHERE id = :w"),
            {"w": canary.window_id},
        )
    finally:
        signing.dispose()
    with owner_reads(canary) as owner:
        assert owner.canary_window(canary.window_id).status == WindowStatus.OPEN
        assert [w.id for w in evaluation_plan(owner).windows] == [canary.window_id]


@pytest.mark.parametrize("role", ROLES)
def test_no_roles_user_writes_an_observation_but_through_the_evaluators_function(canary, role):
    """The latest observation seeds the next look's evidence: an INSERT, UPDATE or DELETE by
    anyone but the evaluator would reset or forge it. Only activation runs the function."""
    engine = as_user(canary.url, role)
    forged = json.dumps(observation(canary.window_id, Verdict.READY, "forged").as_dict())
    try:
        refused(
            engine,
            text(
                "INSERT INTO canary_observations (window_id, at, verdict, observation) "
                "VALUES (:w, now(), 'ready', CAST(:o AS jsonb))"
            ),
            {"w": canary.window_id, "o": forged},
        )
        refused(engine, text("UPDATE canary_observations SET observation = CAST(:o AS jsonb)"), {"o": forged})
        refused(engine, text("DELETE FROM canary_observations"), {})
        if role != "activation":
            refused(engine, RECORD, {"w": canary.window_id, "o": forged})
    finally:
        engine.dispose()
    with owner_reads(canary) as owner:
        assert [o.reasons for o in owner.canary_observations(canary.window_id)] == [["evaluator"]]
        assert owner.canary_window(canary.window_id).status == WindowStatus.OPEN


def test_ready_is_reached_only_with_the_evaluators_observation_and_only_from_open(canary):
    activation = as_user(canary.url, "activation")
    ready = json.dumps(observation(canary.window_id, Verdict.READY).as_dict())
    try:
        refused(activation, text("UPDATE canary_windows SET status = 'ready' WHERE id = :w"), {"w": canary.window_id})
        [(observation_id, moved_to)] = run(activation, RECORD, {"w": canary.window_id, "o": ready}, commit=True)
        assert moved_to == "ready"
        # a ready window is no longer observed: neither a second verdict nor a reset
        again = json.dumps(observation(canary.window_id, Verdict.CONTINUE).as_dict())
        assert "only an open window" in refused(activation, RECORD, {"w": canary.window_id, "o": again})
        bogus = json.dumps({**json.loads(again), "verdict": "promoted"})
        with pytest.raises(DBAPIError):
            run(activation, RECORD, {"w": canary.window_id, "o": bogus})
    finally:
        activation.dispose()
    with owner_reads(canary) as owner:
        window = owner.canary_window(canary.window_id)
        stored = owner.canary_observations(canary.window_id)
    assert window.status == WindowStatus.READY and window.closed_at is None
    assert [o.verdict for o in stored] == [Verdict.CONTINUE, Verdict.READY] and stored[-1].id == observation_id
    assert stored[-1].window_id == canary.window_id


def test_a_window_a_role_opens_is_judged_by_the_thresholds_init_wrote_not_the_openers(canary, tmp_path):
    """Superseding the watched window with one of laxer thresholds, through raw SQL or the
    application with settings of the opener's choosing: the new window's thresholds are the
    operator's."""
    lax = {"length_s": 1, "p95_ratio": 100.0, "false_rollback": 0.5, "min_live_requests": 0}
    signing = as_user(canary.url, "signing")
    try:
        with signing.connect() as conn:
            conn.execute(
                text("UPDATE canary_windows SET status = 'superseded', closed_at = now() WHERE id = :w"),
                {"w": canary.window_id},
            )
            opened = conn.execute(
                text(
                    "INSERT INTO canary_windows (adapter_name, version_id, status, opened_at, thresholds, share, "
                    "bucket_key) VALUES (:n, :v, 'open', now(), CAST(:t AS jsonb), 0, '') RETURNING id"
                ),
                {"n": NAME, "v": canary.version_id, "t": json.dumps(lax)},
            ).scalar_one()
            conn.commit()
    finally:
        signing.dispose()
    with owner_reads(canary) as owner:
        raw = owner.canary_window(opened)
    assert raw.thresholds.length_s == WINDOW_S and raw.thresholds.p95_ratio != 100.0
    laxer = canary.settings.model_copy(
        update={"database_url": role_url(canary.url, "signing"), "canary_window_s": 1, "canary_p95_ratio": 100.0}
    )
    with Registry.open(laxer, principal=IN_PROCESS) as signing_app:
        signing_app.close_canary_window(opened, WindowStatus.SUPERSEDED, "replaced")
        window, created = signing_app.open_canary_window(canary.version_id)
    assert created and window.thresholds.length_s == WINDOW_S and window.thresholds.p95_ratio != 100.0


def test_only_activation_claims_who_waits_for_a_sign_off(canary):
    claim = text("UPDATE canary_windows SET approval_flow_run_id = 'mallory' WHERE id = :w")
    for role in ("signing", "training", "fleet", "admin"):
        engine = as_user(canary.url, role)
        try:
            refused(engine, claim, {"w": canary.window_id})
        finally:
            engine.dispose()


@pytest.mark.parametrize("role", ROLES)
def test_no_roles_user_reads_a_windows_bucket_key(canary, role):
    engine = as_user(canary.url, role)
    try:
        refused(engine, text("SELECT bucket_key FROM canary_windows"), {})
        [(status,)] = run(engine, text("SELECT status FROM canary_windows WHERE id = :w"), {"w": canary.window_id})
        assert status == "open"
    finally:
        engine.dispose()


@pytest.mark.parametrize("role", ROLES)
def test_every_read_of_the_windows_the_pipeline_makes_runs_as_each_roles_user(canary, role):
    """The reads every pool makes of the windows (what waits between gates: the advance
    sweep, as fleet; the windows and their observations: the evaluation, the UI) name no
    bucket key, so none is refused: an ``EXISTS (SELECT *)`` once was."""
    as_role = canary.settings.model_copy(update={"database_url": role_url(canary.url, role)})
    with Registry.open(as_role, principal=IN_PROCESS) as registry:
        registry.waiting()
        assert [w.id for w in registry.canary_windows()] == [canary.window_id]
        assert [o.verdict for o in registry.canary_observations(canary.window_id)] == [Verdict.CONTINUE]
        assert registry.latest_canary_window(canary.version_id).id == canary.window_id


def test_migration_0015_goes_down_and_up_again_with_observations_in_place(canary):
    owner = make_engine(make_url(canary.url))
    signing = as_user(canary.url, "signing")
    try:
        migrate.downgrade(owner, "0014")
        # 0014's grants: the signing user observes and reads bucket keys again
        run(signing, text("SELECT bucket_key FROM canary_windows"), {})
        migrate.upgrade(owner)
        assert migrate.current_revision(owner) == migrate.HEAD
        refused(signing, text("SELECT bucket_key FROM canary_windows"), {})
    finally:
        owner.dispose()
        signing.dispose()
    with owner_reads(canary) as registry:
        registry.init()  # the thresholds column came back empty: init writes it again
        assert [o.verdict for o in registry.canary_observations(canary.window_id)] == [Verdict.CONTINUE]
        registry.record_canary_observation(observation(canary.window_id, Verdict.UNDECIDED))
        assert registry.canary_window(canary.window_id).status == WindowStatus.UNDECIDED
