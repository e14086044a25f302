"""The pipeline's pools apart on one host: each pool's worker starts from an allowlisted
environment (``loragate/local/pipeline.worker_environment``) -- its own secrets directory's path, the
Prefect client's settings, the loragate settings it was given -- never its parent's whole
environment; and on Postgres its secrets directory holds the URL of its role's database
user, never the owner's, which it reads instead of ``LORAGATE_DATABASE_URL``.

What the worker really started with is read back from ``/proc/<pid>/environ``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from loragate.local.pipeline import POOLS, PipelineSecrets, start_pool_worker, write_secrets
from loragate.local.prefect_local import stop_process
from loragate.registry.rules.access import Role
from loragate.tasks.credentials import DATABASE_URL_FILE, SECRETS_DIR_VARIABLE, settings_for, write_pool_secrets
from tests.support.prefect_env import prefect_server_fixture  # noqa: F401  (a fixture)

OWNER_URL = "postgresql://owner:owner-password@127.0.0.1:5432/registry"
# what the parent process holds and no worker may start with
PARENT_SECRETS = {
    "LORAGATE_TOKEN": "lgt_0123456789ab_parents-own-token-parents-own-token-parents-o",
    "LORAGATE_DATABASE_URL": OWNER_URL,
    "AWS_SECRET_ACCESS_KEY": "parents-aws-secret",
    "HF_TOKEN": "hf_parents_secret",
    "PREFECT_SERVER_API_AUTH_STRING": "admin:the-servers-own",
    "PREFECT_API_DATABASE_CONNECTION_URL": "postgresql+asyncpg://prefect:prefect-db-password@db/prefect",
    "A_PARENT_ONLY_SETTING": "parents-only",
}


def environ_of(pid: int, timeout_s: float = 30.0) -> dict[str, str]:
    """The environment ``pid`` was exec'd with (after the exec: before it, /proc shows the
    parent's copy)."""
    end = time.monotonic() + timeout_s
    while b"loragate.local.warm_worker" not in Path(f"/proc/{pid}/cmdline").read_bytes():
        assert time.monotonic() < end, f"{pid} never exec'd the worker"
        time.sleep(0.05)
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(entry.decode().split("=", 1) for entry in raw.split(b"\0") if b"=" in entry)


@pytest.mark.parametrize(
    ("database_url", "role_url"),
    [
        (OWNER_URL, "postgresql://loragate_{role}@127.0.0.1:5432/registry"),
        # SQLite has no users: the file is the registry, and the URL is a path, not a secret
        ("sqlite:///{tmp}/registry.db", None),
    ],
    ids=["postgres", "sqlite"],
)
def test_each_pools_worker_starts_with_its_own_secrets_directory_and_nothing_of_its_parents(
    prefect_server, tmp_path, monkeypatch, database_url, role_url
):
    database_url = database_url.format(tmp=tmp_path)
    for name, value in PARENT_SECRETS.items():
        monkeypatch.setenv(name, value)
    tokens = {pool.role: f"lgt_{i:012x}_{pool.role.value}-pipeline-token" for i, pool in enumerate(POOLS)}
    secrets = PipelineSecrets(tokens, b"-----BEGIN EC PRIVATE KEY-----signing", "xoxb-slack-token")
    dirs = write_secrets(tmp_path / "secrets", secrets, database_url)
    loragate_env = {
        "LORAGATE_DATABASE_URL": database_url,
        "LORAGATE_HOME": str(tmp_path / "home"),
        "LORAGATE_TOKEN": "lgt_0123456789ab_handed-to-the-pipeline-by-mistake-xxxxxxxxxxxx",
    }
    never = [*PARENT_SECRETS.values(), *tokens.values(), "signing", "xoxb-slack-token", loragate_env["LORAGATE_TOKEN"]]
    for pool in POOLS:
        worker = start_pool_worker(prefect_server, pool, loragate_env, dirs[pool.name])
        try:
            env = environ_of(worker.pid)
        finally:
            stop_process(worker)
        values = "\n".join(f"{k}={v}" for k, v in env.items())
        assert env[SECRETS_DIR_VARIABLE] == str(dirs[pool.name]), pool.name
        assert [str(d) for name, d in dirs.items() if name != pool.name and str(d) in values] == [], pool.name
        assert [s for s in never if s in values] == [], pool.name
        assert "A_PARENT_ONLY_SETTING" not in env and "LORAGATE_TOKEN" not in env, pool.name
        # the Prefect client's credential, which every worker needs, and nothing of the server's
        assert env["PREFECT_API_AUTH_STRING"] == prefect_server.auth_string, pool.name
        assert env["PREFECT_API_URL"] == prefect_server.api_url, pool.name
        held = (dirs[pool.name] / DATABASE_URL_FILE).read_text() if role_url else None
        if role_url:  # its role's database user, from its secrets: the environment names none
            assert held == role_url.format(role=pool.role.value), pool.name
            assert "LORAGATE_DATABASE_URL" not in env, pool.name
        else:
            assert not (dirs[pool.name] / DATABASE_URL_FILE).exists()
            assert env["LORAGATE_DATABASE_URL"] == database_url, pool.name


def test_a_flow_run_connects_as_its_pools_database_user_whatever_the_environment_says(tmp_path, monkeypatch):
    monkeypatch.setenv("LORAGATE_DATABASE_URL", OWNER_URL)
    role_url = "postgresql://loragate_fleet@127.0.0.1:5432/registry"
    directory = write_pool_secrets(tmp_path / "fleet", {Role.FLEET: "lgt_0123456789ab_fleet"}, database_url=role_url)
    monkeypatch.setenv(SECRETS_DIR_VARIABLE, str(directory))
    assert settings_for(Role.FLEET).database_url == role_url
