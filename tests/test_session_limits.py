"""Every registry session on Postgres is bounded (issue 18): a lock waited for, a statement,
and a transaction left idle each have a limit (``LORAGATE_DATABASE_LOCK_TIMEOUT_S``,
``_STATEMENT_TIMEOUT_S``, ``_IDLE_IN_TRANSACTION_TIMEOUT_S``). A ``loragate rollback``
behind a move that holds the adapter (a stuck promotion) gives up after the lock limit with
``database_busy`` and changes nothing; a move whose block stalls past the idle limit loses
its session -- its lock goes with it, nothing it wrote stays, and its commit's failure
reverts its switch. The limits are small here so
the test is quick; what the defaults bound is measured in
docs/benchmarks/scale.md#a-stuck-promotion."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import create_engine, text

from loragate.registry.errors import ErrorCode, Unavailable
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from tests.support.moves import promote, rollback
from tests.support.registries import IN_PROCESS, mark_validated
from tests.support.switches import RecordingSwitch

pytestmark = pytest.mark.postgres

NAME = "acme/tiny-llama/support"
LIMIT_S = 1.0


@pytest.fixture
def limited(pg_template, tiny_base, seeded_bundles, tmp_path):
    """v1 in production, v2 in production after it (so a rollback has somewhere to go), on
    a registry whose sessions have 1 s limits."""
    limited_settings = Settings(
        home=tmp_path / "home",
        database_url=pg_template(),
        artifacts=str(tmp_path / "artifacts"),
        database_lock_timeout_s=LIMIT_S,
        database_statement_timeout_s=LIMIT_S * 2,
        database_idle_in_transaction_timeout_s=LIMIT_S,
    )
    registry = Registry.open(limited_settings, check_schema=False, principal=IN_PROCESS)
    registry.init()
    registry.add_base(str(tiny_base), "tiny-llama")
    v1, v2 = (registry.register_adapter(b, NAME).version.version_id for b in seeded_bundles[:2])
    for v in (v1, v2):
        mark_validated(registry, v)
        promote(registry, v, "canary")
        promote(registry, v, "production")
    yield registry, v1, v2
    registry.close()


def test_a_rollback_behind_a_held_adapter_gives_up_at_the_lock_limit_and_changes_nothing(limited):
    registry, v1, v2 = limited
    holder = create_engine(registry.settings.database_url)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:  # what a promotion stuck on a replica does: the adapter's row, held
        with holder.begin() as conn:
            conn.execute(text("SELECT id FROM adapters WHERE name = :n FOR UPDATE"), {"n": NAME})
            held.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(30)
        started = time.monotonic()
        with pytest.raises(Unavailable) as busy:
            rollback(registry, NAME, "production", reason="incident")
        waited = time.monotonic() - started
    finally:
        release.set()
        thread.join(30)
        holder.dispose()
    assert (busy.value.code, busy.value.field) == (ErrorCode.DATABASE_BUSY, "LORAGATE_DATABASE_LOCK_TIMEOUT_S")
    assert LIMIT_S <= waited < LIMIT_S + 5, waited
    assert registry.get_adapter(NAME).production == v2
    rollback(registry, NAME, "production", reason="incident")  # the adapter free again: it moves
    assert registry.get_adapter(NAME).production == v1


def test_a_statement_past_the_statement_limit_is_cancelled_as_busy(limited):
    registry, _, _ = limited
    with pytest.raises(Unavailable) as busy, registry._store.db.write() as conn:
        conn.execute(text("SELECT pg_sleep(:s)"), {"s": LIMIT_S * 4})
    assert (busy.value.code, busy.value.field) == (ErrorCode.DATABASE_BUSY, "LORAGATE_DATABASE_STATEMENT_TIMEOUT_S")


def test_a_move_stalled_past_the_idle_limit_loses_its_session_its_lock_and_its_writes_and_reverts_its_switch(limited):
    registry, v1, v2 = limited
    before = registry.history(NAME)
    switch = RecordingSwitch()
    with pytest.raises(Unavailable) as lost, registry.rollback_move(NAME, "production", switch=switch, reason="stalls"):
        time.sleep(LIMIT_S * 3)  # a replica that never answers, under the lock
    assert (lost.value.code, lost.value.field) == (
        ErrorCode.DATABASE_UNAVAILABLE,
        "LORAGATE_DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_S",
    )
    assert registry.get_adapter(NAME).production == v2 and registry.history(NAME) == before
    assert switch.reverted == 1  # the failed commit's undo, the move's one
    # the lock went with the session: were it still held, this would fail as database_busy
    rollback(registry, NAME, "production", reason="incident")
    assert registry.get_adapter(NAME).production == v1
