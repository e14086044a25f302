"""Each gate keeps its promise when a real component fails in the middle of it, and a
re-run converges once the failure is gone: Postgres stopped while a promotion is switching
the replicas, a replica process killed during the switch, the S3 server stopped under a
promotion. At no moment after a failure do the production replicas serve two versions.

(A flow process killed mid-switch is tests/test_pipeline.py; a replica answering 500,
hanging or refusing connections mid-switch is tests/test_fleet.py; S3 down or stalled
under register and materialize is tests/test_outages.py.)
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from loragate.registry.db.database import SessionLimits, make_engine
from loragate.registry.errors import DeployFailed, ErrorCode, Unavailable
from loragate.registry.service import Registry
from loragate.tasks.fleet import FleetSwitch, promote_and_switch
from tests.support.fleet import Fleet, answer, make_fleet, served
from tests.support.moves import promote
from tests.support.registries import IN_PROCESS

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class PrivatePostgres:
    """A Postgres cluster of the test's own, so stopping it touches nobody else."""

    data: Path
    port: int
    bindir: Path

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", str(self.bindir / "pg_ctl"), "-D", str(self.data / "db"), *args],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._ctl("-o", options, "-l", str(self.data / "log"), "-w", "start")

    def stop(self) -> None:
        self._ctl("-m", "immediate", "-w", "stop")  # as a crash: no checkpoint, clients cut off


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    bindir = max(Path("/usr/lib/postgresql").glob("*/bin"))
    data = Path(tempfile.mkdtemp(prefix="loragate-pg-"))
    shutil.chown(data, "postgres", "postgres")
    subprocess.run(
        ["runuser", "-u", "postgres", "--", str(bindir / "initdb"), "-D", str(data / "db"), "-A", "trust"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    pg = PrivatePostgres(data, _free_port(), bindir)
    pg.start()
    try:
        yield pg
    finally:
        subprocess.run(
            [
                "runuser",
                "-u",
                "postgres",
                "--",
                str(bindir / "pg_ctl"),
                "-D",
                str(data / "db"),
                "-m",
                "immediate",
                "stop",
            ],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(data, ignore_errors=True)


def canaried_fleet(tmp_path, replicas, replica_adapters, validated_adapters, **settings):
    """v1 in production on every replica, v2 the canary, both validated and signed."""
    fleet = make_fleet(tmp_path, replicas, replica_adapters, validated_adapters, **settings)
    fleet.promote(fleet.v1, "canary")
    fleet.promote(fleet.v1, "production")
    fleet.promote(fleet.v2, "canary")
    return fleet


def production_serves(replicas, fleet: Fleet) -> set[str]:
    """The paths the production replicas serve the adapter from: one, when all agree."""
    return {served(r).get(fleet.name, "") for r in replicas.values() if r.role == "production"}


def test_postgres_stopped_mid_promotion_leaves_the_previous_production_serving_and_a_rerun_converges(
    private_postgres, replicas, replica_adapters, validated_adapters, tmp_path, monkeypatch
):
    fleet = canaried_fleet(
        tmp_path,
        replicas,
        replica_adapters,
        validated_adapters,
        database_url=private_postgres.url,
        database_connect_timeout_s=2,
    )
    v1_path, v2_path = fleet.path(fleet.v1), fleet.path(fleet.v2)  # read while the database is up
    try:
        switch = FleetSwitch.apply

        def switch_then_lose_the_database(self, plan):
            report = switch(self, plan)  # every production replica now serves v2 ...
            assert production_serves(replicas, fleet) == {v2_path}
            private_postgres.stop()  # ... and the database dies before the pointer move commits
            return report

        monkeypatch.setattr(FleetSwitch, "apply", switch_then_lose_the_database)
        with pytest.raises(Unavailable):
            promote_and_switch(fleet.registry, fleet.v2, "production")
        monkeypatch.undo()
        # the switch was put back at once: production serves the one version the database says
        assert production_serves(replicas, fleet) == {v1_path}

        private_postgres.start()
        assert fleet.registry.get_adapter(fleet.name).production == fleet.v1  # never committed
        promote_and_switch(fleet.registry, fleet.v2, "production")  # the re-run, from the top
        assert fleet.registry.get_adapter(fleet.name).production == fleet.v2
        assert production_serves(replicas, fleet) == {fleet.path(fleet.v2)}
    finally:
        fleet.registry.close()


def test_a_replica_killed_mid_promotion_moves_nothing_and_serves_production_when_it_is_back(
    replicas, replica_adapters, validated_adapters, tmp_path, monkeypatch
):
    fleet = canaried_fleet(tmp_path, replicas, replica_adapters, validated_adapters, replica_connect_timeout_s=1)
    victim = replicas["prod-b"]
    try:
        move = FleetSwitch._move

        def kill_one_replica_then_move(self, m, expected):
            if m.replica.url == victim.url:
                victim.kill()  # the process dies as its switch begins
            return move(self, m, expected)

        monkeypatch.setattr(FleetSwitch, "_move", kill_one_replica_then_move)
        with pytest.raises(DeployFailed) as failed:
            promote_and_switch(fleet.registry, fleet.v2, "production")
        monkeypatch.undo()
        assert victim.url in failed.value.message
        assert fleet.registry.get_adapter(fleet.name).production == fleet.v1
        assert served(replicas["prod-a"])[fleet.name] == fleet.path(fleet.v1)  # put back at once
    finally:
        victim.start()  # in this thread: a replica dies with the thread that started it
    try:
        # back up empty, it answers the adapter with production from its first request
        expected = fleet.registry.expected_outputs(fleet.v1)
        assert expected is not None
        assert answer(victim.url, fleet.name) == expected[1]["support-0"].strip()
        assert production_serves(replicas, fleet) == {fleet.path(fleet.v1)}
        promote_and_switch(fleet.registry, fleet.v2, "production")  # the re-run converges
        assert production_serves(replicas, fleet) == {fleet.path(fleet.v2)}
    finally:
        fleet.registry.close()


def test_the_s3_server_stopped_under_a_promotion_refuses_it_and_a_rerun_after_it_is_back_converges(
    cataloged, seeded_bundles, s3_endpoint
):
    """Production is verified against the stored bytes: with the store gone, nothing moves."""
    from moto.server import ThreadedMotoServer

    from tests.support.registries import mark_validated

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    registry, _ = cataloged
    settings = registry.settings.model_copy(
        update={
            "artifacts": f"s3://faults-{uuid.uuid4().hex[:8]}/artifacts",
            "s3_endpoint_url": f"http://127.0.0.1:{port}",
            "s3_connect_timeout_s": 1.0,
            "s3_read_timeout_s": 2.0,
            "s3_max_attempts": 1,
        }
    )
    import boto3

    boto3.client("s3", endpoint_url=settings.s3_endpoint_url, region_name="us-east-1").create_bucket(
        Bucket=settings.artifacts.split("/")[2]
    )
    on_s3 = Registry.open(settings, principal=IN_PROCESS)
    on_s3.init()
    try:
        name = "acme/tiny-llama/support"
        v1, v2 = (on_s3.register_adapter(b, name).version.version_id for b in seeded_bundles[:2])
        for v in (v1, v2):
            mark_validated(on_s3, v)
        promote(on_s3, v1, "canary")
        promote(on_s3, v1, "production")
        promote(on_s3, v2, "canary")
        server.stop()
        with pytest.raises(Unavailable):
            promote(on_s3, v2, "production")
        assert on_s3.get_adapter(name).production == v1
        server = ThreadedMotoServer(
            ip_address="127.0.0.1", port=port, verbose=False
        )  # the same data: moto keeps it in process
        server.start()
        promote(on_s3, v2, "production")
        assert on_s3.get_adapter(name).production == v2
    finally:
        on_s3.close()
        server.stop()


def _take_every_slot(url: str) -> list[psycopg.Connection]:
    """Connections until the server refuses one: it is full."""
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    held: list[psycopg.Connection] = []
    while True:
        try:
            held.append(psycopg.connect(dsn, connect_timeout=5))
        except psycopg.OperationalError:
            return held


def test_a_full_database_makes_a_call_wait_for_a_free_slot_and_a_database_that_stays_full_fails_in_one_deadline(
    private_postgres,
):
    held = _take_every_slot(private_postgres.url)
    engine = make_engine(make_url(private_postgres.url), SessionLimits(connect_timeout_s=4))
    try:
        assert len(held) >= 90  # the default 100 slots, less the ones kept for the superuser
        release = threading.Timer(1.0, held.pop().close)
        release.start()
        started = time.monotonic()
        with engine.connect() as conn:
            assert conn.execute(text("select 1")).scalar() == 1
        waited = time.monotonic() - started
        release.join()
        assert 0.9 <= waited < 4

        engine.dispose()  # the slot is back in the pool's hands: give it to a new holder
        held.extend(_take_every_slot(private_postgres.url))
        started = time.monotonic()
        with pytest.raises(Unavailable) as refused:
            engine.connect()
        assert refused.value.code == ErrorCode.DATABASE_UNAVAILABLE
        assert 4 <= time.monotonic() - started < 4 + 2 + 1  # the deadline, plus one attempt's libpq timeout at most
    finally:
        engine.dispose()
        for conn in held:
            conn.close()
