"""Pytest fixtures for a real Prefect server: one ``prefect server start`` per test session.

Tests that need Prefect's scheduler, workers or UI (none of which exist in ephemeral mode
or under ``prefect_test_harness``) import the fixture::

    from tests.support.prefect_env import prefect_server_fixture  # noqa: F401  (registers `prefect_server`)

    def test_something(prefect_server): ...

(the fixture is *named* ``prefect_server`` but bound to another attribute, so that a test's
``prefect_server`` parameter does not shadow the import: ruff's F811)

and run code of their own against it inside ``client_env(server)``. Subprocesses (a
worker, the ``prefect`` CLI, ``loragate``) get ``server.env``. The launcher itself lives in
``loragate.local.prefect_local`` (``make demo`` starts the same server).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from kit.postgres import PG_ADMIN_URL
from loragate.local.prefect_local import (
    FAST_POLL_ENV,
    PrefectServer,
    start_local_prefect_server,
    start_prefect_server,
    start_worker,
    stop,
    stop_process,
)

__all__ = [
    "FAST_POLL_ENV",
    "PrefectServer",
    "client_env",
    "prefect_server_fixture",
    "start_prefect_server",
    "start_worker",
    "stop",
    "stop_process",
    "wait_for_state",
]


@pytest.fixture(scope="session", name="prefect_server")
def prefect_server_fixture(tmp_path_factory) -> Iterator[PrefectServer]:
    """The local stack's server (``start_local_prefect_server``, what ``make demo`` and
    ``start_pipeline`` start) on a Postgres database of its own: workers, flow runs, the test
    process and a browser write to it at once, and SQLite would answer 503 "database is
    locked" (Prefect #18934) -- a browser's resume request among them."""
    from sqlalchemy import create_engine, text

    database = f"prefect_{uuid.uuid4().hex[:10]}"
    try:
        server = start_local_prefect_server(tmp_path_factory.mktemp("prefect-server"), database=database)
        try:
            assert server.on_postgres, "the local stack's Prefect server fell back to SQLite: no Postgres answered"
            yield server
        finally:
            _drain_clients()
            stop(server)
    finally:
        admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))
        admin.dispose()


def _drain_clients(timeout_s: float = 15.0) -> None:
    """Send this process's queued Prefect logs and events while the server still listens:
    left for interpreter exit, they retry against a dead port for over a minute."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    for service in (APILogWorker, EventsWorker):
        service.drain_all(timeout=timeout_s, at_exit=False)


@contextmanager
def client_env(server: PrefectServer) -> Iterator[None]:
    """Point Prefect clients and flows in this thread at ``server`` (settings are
    context-local: a thread of its own must enter this itself)."""
    from prefect.settings import temporary_settings

    # Prefect's events and logs workers are one per process, bound to the API of the moment
    # they started: drained on the way in and out, the next one starts against the right API
    _drain_clients()
    with temporary_settings(updates=server.client_settings()):
        try:
            yield
        finally:
            _drain_clients()


def wait_for_state(server: PrefectServer, flow_run_id, state: str, timeout_s: float = 120.0):
    """Poll the server until the flow run's state type is ``state`` (``PAUSED``,
    ``COMPLETED``, ...); return the flow run. Raises AssertionError on timeout."""
    from prefect import get_client

    end = time.monotonic() + timeout_s
    with client_env(server), get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(flow_run_id)
            if run.state is not None and run.state.type.value == state:
                return run
            if time.monotonic() > end:
                seen = run.state.type.value if run.state else None
                raise AssertionError(f"flow run {flow_run_id} not {state} after {timeout_s:.0f} s (it is {seen})")
            time.sleep(0.5)
