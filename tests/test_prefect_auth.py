"""The orchestrator is not open: the Prefect server loragate starts (tests, ``make demo``)
has API authentication on. A client that can reach the port but holds no credential --
or a wrong one -- reads no block (with or without ``include_secrets``), no run, variable,
artifact or event, resumes no paused run, runs no deployment and emits no event, over HTTP
or the events WebSocket; only the health probes answer. With the credential every route
works. The credential is kept beside the server's database, readable by its owner only.
"""

from __future__ import annotations

import json
import stat
import uuid
from datetime import UTC, datetime

import httpx
import pytest
from websockets.exceptions import WebSocketException
from websockets.sync.client import connect

from loragate.local.prefect_local import AUTH_FILE
from tests.support.prefect_env import prefect_server_fixture  # noqa: F401  (registers `prefect_server`)

ANY_ID = str(uuid.uuid4())
TRAINING_EVENT = {
    "id": str(uuid.uuid4()),
    "occurred": datetime.now(UTC).isoformat(),
    "event": "loragate.training.completed",
    "resource": {"prefect.resource.id": "loragate.training.forged"},
    "payload": {"bundle": "/tmp/evil", "name": "acme/tiny-llama/support"},
}
# (method, route, body): what an attacker with network access would try first
ROUTES = [
    ("GET", f"/block_documents/{ANY_ID}?include_secrets=true", None),
    ("POST", "/block_documents/filter?include_secrets=true", {}),
    ("POST", "/variables/filter", {}),
    ("POST", "/artifacts/filter", {}),
    ("POST", "/flow_runs/filter", {}),
    ("POST", "/logs/filter", {}),
    ("POST", "/deployments/filter", {}),
    ("POST", "/events/filter", {"filter": {}}),
    ("POST", f"/flow_runs/{ANY_ID}/resume", {"run_input": {"approve": True, "reviewer": "alice"}}),
    ("POST", f"/deployments/{ANY_ID}/create_flow_run", {"parameters": {"name": "acme/tiny-llama/support"}}),
    ("POST", "/events", [TRAINING_EVENT]),
]


def call(server, method: str, route: str, body, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.request(method, f"{server.api_url}{route}", json=body, headers=headers or {}, timeout=30)


@pytest.mark.parametrize(("method", "route", "body"), ROUTES, ids=[f"{m} {r.split('?')[0]}" for m, r, _ in ROUTES])
@pytest.mark.parametrize("credential", ["none", "wrong", "malformed"])
def test_without_the_servers_credential_no_route_answers(prefect_server, method, route, body, credential):
    headers = {
        "none": {},
        "wrong": {"Authorization": "Basic " + "bG9yYWdhdGU6bm9wZQ=="},  # loragate:nope
        "malformed": {"Authorization": "Bearer " + prefect_server.auth_string},
    }[credential]
    assert call(prefect_server, method, route, body, headers).status_code == 401


def test_with_the_credential_the_same_routes_answer_and_no_forged_event_got_in(prefect_server):
    for method, route, body in ROUTES[:8]:
        response = call(prefect_server, method, route, body, prefect_server.auth_headers())
        assert response.status_code in (200, 404), (route, response.status_code, response.text[:200])
    found = call(
        prefect_server,
        "POST",
        "/events/filter",
        {"filter": {"event": {"name": ["loragate.training.completed"]}}},
        prefect_server.auth_headers(),
    ).json()
    assert TRAINING_EVENT["id"] not in {e["id"] for e in found["events"]}


def test_the_health_probes_stay_open(prefect_server):
    assert httpx.get(f"{prefect_server.api_url}/health", timeout=10).status_code == 200


@pytest.mark.parametrize("subprotocols", [None, ["prefect"]], ids=["legacy", "prefect protocol"])
def test_the_events_websocket_takes_no_event_without_the_credential(prefect_server, subprotocols):
    url = prefect_server.api_url.replace("http://", "ws://") + "/events/in"
    # refused at the handshake, or closed after the auth message
    with pytest.raises(WebSocketException), connect(url, subprotocols=subprotocols, open_timeout=10) as socket:
        if subprotocols:
            socket.send(json.dumps({"type": "auth", "token": "loragate:nope"}))
        socket.send(json.dumps(TRAINING_EVENT))
        socket.recv(timeout=10)


def test_the_credential_is_kept_beside_the_server_readable_by_its_owner_only(prefect_server):
    kept = prefect_server.home / AUTH_FILE
    assert kept.read_text().strip() == prefect_server.auth_string
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert len(prefect_server.auth_string.split(":", 1)[1]) >= 32
