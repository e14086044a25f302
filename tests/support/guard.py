"""The admin guard in front of a Starlette app, outside vLLM: a replica's secrets directory
holding the fleet's key, its adapter directory and role, and the guard installed as vLLM's
``--middleware`` installs it (``qualified`` not patched: there is no vLLM table here)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "infra" / "vllm_plugin"
if str(PLUGIN_DIR) not in sys.path:
    sys.path.insert(0, str(PLUGIN_DIR))
from loragate_resolver import admin_guard, qualified  # noqa: E402

KEY = "k" * 43


@contextmanager
def guarded_client(app: FastAPI, tmp_path: Path, monkeypatch, **env: str) -> Iterator[TestClient]:
    """A client of ``app`` behind the admin guard of a production replica (``env``: more of
    the replica's environment)."""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "admin-key").write_text(KEY)
    monkeypatch.setenv("LORAGATE_REPLICA_SECRETS_DIR", str(secrets))
    monkeypatch.setenv("LORAGATE_ADAPTER_DIR", str(tmp_path / "adapters"))
    monkeypatch.setenv("LORAGATE_REPLICA_ROLE", "production")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(qualified, "install", lambda: True)
    app.add_middleware(admin_guard.AdminGuard)
    with TestClient(app) as client:
        yield client
