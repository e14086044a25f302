"""The live split over a fake vLLM (a small ASGI app), for the split's unit tests: the
environment a replica's split reads, a split holding a table the test sets -- the test
replicas' (``loragate_faults.FaultInjectingSplit``), injecting the faults ``split_env``'s file
names -- and requests sent through it."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from loragate.local.replica_split import FAULTS_ROOT

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "infra" / "vllm_plugin"
# as on a test replica: the plugin installed, the fault injector's folder on the path
for folder in (PLUGIN_DIR, FAULTS_ROOT):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
from loragate_faults import FaultInjectingSplit  # noqa: E402
from loragate_resolver import routing  # noqa: E402

KEY = "k" * 43
FEEDBACK_KEY = "f" * 43
BUCKET_KEY = "b" * 64
NAME = "acme/tiny-llama/support"


def window(window_id: int, canary: str, share: float, bucket_key: str | None = BUCKET_KEY) -> routing.Route:
    return routing.Route(NAME, "p1", window_id, canary, share, bucket_key)


class FakeVllm:
    """Answers each model with a status from ``statuses`` (default 200) and a usage of
    ``tokens`` completion tokens; streams two events and [DONE] when asked to."""

    def __init__(self, statuses: dict[str, int] | None = None, tokens: int = 16) -> None:
        self.statuses = statuses or {}
        self.tokens = tokens
        self.asked: list[str] = []
        self.headers_seen: list[dict] = []

    async def __call__(self, scope, receive, send):
        message = await receive()
        body = json.loads(message["body"])
        self.asked.append(body["model"])
        self.headers_seen.append(dict(scope["headers"]))
        status = self.statuses.get(body["model"], 200)
        if body.get("stream") and status == 200:
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
            )
            for event in (b'data: {"x": 1}\n\n', b'data: {"x": 2}\n\n', b"data: [DONE]\n\n"):
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        payload = json.dumps({"model": body["model"], "usage": {"completion_tokens": self.tokens}}).encode()
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
        )
        await send({"type": "http.response.body", "body": payload})


@pytest.fixture
def split_env(tmp_path, monkeypatch):
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "admin-key").write_text(KEY)
    (secrets / "feedback-key").write_text(FEEDBACK_KEY)
    adapters = tmp_path / "adapters"
    adapters.mkdir()
    index = {"format": 2, "roles": {"production": {NAME: {"version": "p1", "path": str(adapters / "p1")}}}}
    (adapters / ".loragate-index.json").write_text(json.dumps(index))
    monkeypatch.setenv("LORAGATE_REPLICA_SECRETS_DIR", str(secrets))
    monkeypatch.setenv("LORAGATE_ADAPTER_DIR", str(adapters))
    monkeypatch.setenv("LORAGATE_REPLICA_ROLE", "production")
    monkeypatch.setenv("LORAGATE_BASE_MODEL_NAME", "tiny-llama")
    monkeypatch.setenv("LORAGATE_BREAKER_ERRORS", "2")
    faults = tmp_path / "faults.json"
    monkeypatch.setenv("LORAGATE_REPLICA_FAULTS", str(faults))
    return faults


def _split(app, route: routing.Route | None) -> FaultInjectingSplit:
    split = FaultInjectingSplit(app)
    split._loop = "off"  # type: ignore[assignment]  # no background reads: the test sets the table
    split.routes = {route.adapter: route} if route else {}
    split.loaded = True
    split.table_started = float("inf")
    return split


def call(split, path="/v1/completions", body=None, headers=(), method="POST", trickle_s: float = 0.0, query=b""):
    """(status, headers, body) of one request through ``split``; ``trickle_s``: its body's
    last part comes that long after its first byte, as a slow client sends it; ``query``: its
    query string, as the server hands it over (bytes, not decoded)."""
    raw = json.dumps(body).encode() if body is not None else b""
    sent: list[dict] = []
    parts = [raw[:1], raw[1:]] if trickle_s and len(raw) > 1 else [raw]

    async def receive():
        part = parts.pop(0)
        if not parts and trickle_s:
            await asyncio.sleep(trickle_s)
        return {"type": "http.request", "body": part, "more_body": bool(parts)}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "query_string": query,
        "headers": list(headers),
        "server": ("h", 1),
    }
    asyncio.run(split(scope, receive, send))
    start = sent[0]
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def ask(split, user="alice", model=NAME, **extra):
    return call(split, body={"model": model, "prompt": "hi", "user": user, **extra})
