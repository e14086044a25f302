"""An unreachable or stalled artifact store or database is one typed line and exit 1, in bounded time.

The S3 endpoint is a real socket: a closed port (down), or a server that accepts the
connection and never answers (stalled). The database is the real Postgres on a port
nothing listens on. Nothing is written when a component is out.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from kit.http_faults import silent_endpoint
from loragate.cli.main import main
from tests.support.commands import main_with_tokens, role_tokens
from tests.support.registries import registry_snapshot

NAME = "acme/tiny-llama/support"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def stalled_endpoint():
    """Accepts every connection and never says a word."""
    with silent_endpoint() as url:
        yield url


TOKENS: dict[str, str] = {}


def run(capsys, *argv: str) -> tuple[int, dict | None, list[str]]:
    rc = main_with_tokens(TOKENS, [*argv, "--json"])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if out.strip() else None), err.strip().splitlines()


@pytest.fixture
def on_s3(cataloged, monkeypatch, s3_location, s3_endpoint):
    """A working registry on S3, which the tests then point at an endpoint that is out."""
    registry, _ = cataloged
    monkeypatch.setenv("LORAGATE_DATABASE_URL", registry.settings.database_url)
    monkeypatch.setenv("LORAGATE_ARTIFACTS", s3_location)
    monkeypatch.setenv("LORAGATE_S3_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("LORAGATE_S3_CONNECT_TIMEOUT_S", "1")
    monkeypatch.setenv("LORAGATE_S3_READ_TIMEOUT_S", "1")
    monkeypatch.setenv("LORAGATE_S3_MAX_ATTEMPTS", "1")
    assert main(["init"]) == 0
    TOKENS.clear()
    TOKENS.update(role_tokens(registry))
    return registry


@pytest.mark.parametrize("outage", ["down", "stalled"])
def test_an_unreachable_artifact_store_is_one_line_exit_1_and_writes_nothing(
    on_s3, monkeypatch, capsys, random_bundle, stalled_endpoint, outage
):
    capsys.readouterr()
    endpoint = f"http://127.0.0.1:{closed_port()}" if outage == "down" else stalled_endpoint
    monkeypatch.setenv("LORAGATE_S3_ENDPOINT_URL", endpoint)
    rows_before = registry_snapshot(on_s3.settings, artifacts=False)
    started = time.monotonic()
    rc, out, err = run(capsys, "register", str(random_bundle), "--name", NAME)
    elapsed = time.monotonic() - started
    assert rc == 1 and out["error"]["code"] == "artifact_store_unavailable"
    assert len(err) == 1 and err[0].startswith("error: artifact_store_unavailable")
    assert elapsed < 20  # bounded by the timeouts from settings, not by the OS
    assert registry_snapshot(on_s3.settings, artifacts=False) == rows_before


def test_a_stalled_store_during_materialize_is_bounded_too(
    on_s3, monkeypatch, capsys, random_bundle, stalled_endpoint, tmp_path
):
    version = on_s3.register_adapter(random_bundle, NAME).version.version_id
    monkeypatch.setenv("LORAGATE_S3_ENDPOINT_URL", stalled_endpoint)
    capsys.readouterr()
    rc, out, _ = run(capsys, "materialize", version, str(tmp_path / "served"))
    assert rc == 1 and out["error"]["code"] == "artifact_store_unavailable"
    assert not (tmp_path / "served").exists()


@pytest.mark.parametrize("command", [["init"], ["list"], ["resolve", NAME]])
def test_an_unreachable_database_is_one_line_exit_1_with_the_password_hidden(monkeypatch, capsys, tmp_path, command):
    monkeypatch.setenv("LORAGATE_HOME", str(tmp_path))
    monkeypatch.setenv("LORAGATE_DATABASE_URL", f"postgresql://loragate:s3cret-pw@127.0.0.1:{closed_port()}/registry")
    monkeypatch.setenv("LORAGATE_DATABASE_CONNECT_TIMEOUT_S", "2")
    rc, out, err = run(capsys, *command)
    assert rc == 1 and out["error"]["code"] == "database_unavailable"
    assert len(err) == 1 and err[0].startswith("error: database_unavailable [LORAGATE_DATABASE_URL]")
    assert "s3cret-pw" not in err[0] and "s3cret-pw" not in json.dumps(out) and "***" in err[0]


@pytest.mark.parametrize(
    "url", ["postgresql://u:s3cret-pw@[::1", "mysql://u:s3cret-pw@localhost/db", "sqlite://", "not a url"]
)
def test_a_malformed_database_url_is_bad_input_naming_the_variable(monkeypatch, capsys, tmp_path, url):
    monkeypatch.setenv("LORAGATE_HOME", str(tmp_path))
    monkeypatch.setenv("LORAGATE_DATABASE_URL", url)
    rc, out, err = run(capsys, "init")
    assert rc == 2 and out["error"] == {
        "code": "invalid_setting",
        "field": "LORAGATE_DATABASE_URL",
        "message": out["error"]["message"],
    }
    assert len(err) == 1 and "s3cret-pw" not in err[0]
    assert list(tmp_path.iterdir()) == []  # nothing created
