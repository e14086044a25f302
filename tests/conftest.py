"""Shared fixtures: real Postgres, real S3 over HTTP (moto server), a real tiny model.

Models and adapters are built once per session by the offline model kit. Each store
test gets a fresh database: a file for SQLite, a clone of a migrated template database
for Postgres (CREATE DATABASE ... TEMPLATE is far cheaper than migrating each time).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Prefect keeps its state under PREFECT_HOME: never the developer's own
_PREFECT_HOME = Path(os.environ.setdefault("PREFECT_HOME", f"/tmp/loragate-test-prefect-{uuid.uuid4().hex[:8]}"))

# Prefect binds its console log handler to the stderr of the moment it is imported: import
# it now, not inside a test whose captured stderr is closed afterwards
import prefect.main  # noqa: E402,F401  (prefect.main sets logging up)

from registry.service import Registry  # noqa: E402
from registry.settings import Settings  # noqa: E402

PG_ADMIN_URL = os.environ.get("LORAGATE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


# -- models -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kit(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kit")


@pytest.fixture(scope="session")
def tiny_base(kit) -> Path:
    from infra.modelkit import build_base

    return build_base(kit / "tiny-llama")


@pytest.fixture(scope="session")
def random_bundle(kit, tiny_base) -> Path:
    from infra.modelkit import random_adapter

    return random_adapter(tiny_base, kit / "random-adapter")


@pytest.fixture(scope="session")
def support_bundle(kit, tiny_base) -> Path:
    from infra.modelkit import train_adapter

    return train_adapter(tiny_base, "support", kit / "support-adapter")


@pytest.fixture(scope="session")
def tickets_bundle(kit, tiny_base) -> Path:
    from infra.modelkit import train_adapter

    return train_adapter(tiny_base, "tickets", kit / "tickets-adapter")


# -- databases ------------------------------------------------------------------------


def _admin_engine():
    from sqlalchemy import create_engine

    return create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")


def _pg_url(db: str) -> str:
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + db


def _drop_database(admin, name: str) -> None:
    from sqlalchemy import text

    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def pg_template():
    """A migrated Postgres database to clone; dropped with every clone at session end."""
    from sqlalchemy import text

    from registry.store import SqlStore

    admin = _admin_engine()
    prefix = f"loragate_test_{uuid.uuid4().hex[:8]}"
    template = f"{prefix}_template"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{template}"'))
    store = SqlStore.from_url(_pg_url(template))
    store.upgrade_schema()
    store.engine.dispose()
    created: list[str] = []

    def clone() -> str:
        name = f"{prefix}_{len(created)}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
        created.append(name)
        return _pg_url(name)

    yield clone
    for name in created + [template]:
        _drop_database(admin, name)
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
    reg = Registry.open(settings, check_schema=False)
    reg.init()
    yield reg
    reg.store.engine.dispose()


@pytest.fixture
def cataloged(registry, tiny_base):
    """A registry with the tiny base pinned."""
    record, _ = registry.add_base(str(tiny_base), "tiny-llama")
    return registry, record


# -- Prefect --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def prefect_harness():
    """A temporary Prefect API for the session (8-10 s to start: once)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


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
    from infra.modelkit import random_adapter

    return [random_adapter(tiny_base, kit / f"seeded-{seed}", seed=seed + 1) for seed in range(4)]


def mark_validated(registry, version_id: str, passed: bool = True):
    """Record a validation outcome directly: for lifecycle tests that are not about the gate."""
    from registry.store import utcnow

    version = registry.get_version(version_id)
    now = utcnow()
    status = "passed" if passed else "failed"
    return registry.record_validation(version, {
        "status": status, "golden_set_digest": None, "output_sha256": None,
        "report": {"summary": f"marked {status} by the test", "outputs": None}, "started_at": now, "finished_at": now,
    })
