"""The live split over a fake vLLM (a small ASGI app), for the split's unit tests: the
environment a replica's split reads, a split holding a table the test sets -- the test
replicas' (``loragate_faults.FaultInjectingSplit``), injecting the faults ``split_env``'s file
names -- and requests sent through it; a fake engine behind it (``FakeEngine``) where a test
needs the adapter cache vLLM's app state exposes."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

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


class FakeEngine:
    """vLLM's adapter cache as its app state shows it: the serving layer's table (name -> a
    request with its ``lora_int_id``), the worker's LRU of registered ids at ``capacity`` (a
    pinned id never evicted; a load with every id pinned raises, as vLLM's engine step does),
    and the engine client's ``list_loras``, ``pin_lora`` and ``remove_lora``. ``app``: what
    the split finds as ``scope["app"]``."""

    def __init__(self, capacity: int, base: str = "tiny-llama") -> None:
        self.capacity, self.base = capacity, base
        self.lora_requests: dict[str, SimpleNamespace] = {}
        self.registered: OrderedDict[int, None] = OrderedDict()
        self.pinned: set[int] = set()
        self.pin_calls: list[int] = []
        self._last_id = 0
        lora_config = SimpleNamespace(max_cpu_loras=capacity, max_loras=capacity)
        self.app = SimpleNamespace(
            state=SimpleNamespace(
                vllm_config=SimpleNamespace(lora_config=lora_config),
                engine_client=self,
                openai_serving_models=SimpleNamespace(lora_requests=self.lora_requests),
            )
        )

    def use(self, name: str) -> None:
        """A request naming ``name``: resolved under a new id the first time, registered."""
        if name == self.base:
            return
        if name not in self.lora_requests:
            self._last_id += 1
            self.lora_requests[name] = SimpleNamespace(lora_int_id=self._last_id)
        lora_id = self.lora_requests[name].lora_int_id
        if lora_id in self.registered:
            self.registered.move_to_end(lora_id)
            return
        if len(self.registered) >= self.capacity:
            victim = next((i for i in self.registered if i not in self.pinned), None)
            if victim is None:
                raise RuntimeError("All items are pinned, cannot remove oldest from the cache.")
            del self.registered[victim]
        self.registered[lora_id] = None

    def unload(self, name: str) -> None:
        del self.lora_requests[name]  # the engine keeps the id registered (vLLM #54839)

    def names(self) -> set[str]:
        return {n for n, r in self.lora_requests.items() if r.lora_int_id in self.registered}

    async def list_loras(self) -> set[int]:
        return set(self.registered)

    async def pin_lora(self, lora_id: int) -> bool:
        if lora_id not in self.registered:
            raise ValueError(f"Pinning failed. LoRA {lora_id} is not registered.")
        self.pin_calls.append(lora_id)
        self.pinned.add(lora_id)
        return True

    async def remove_lora(self, lora_id: int) -> bool:
        self.pinned.discard(lora_id)
        present = lora_id in self.registered
        self.registered.pop(lora_id, None)
        return present


class FakeVllm:
    """Answers each model with a status from ``statuses`` (default 200) and a usage of
    ``tokens`` completion tokens; streams two events and [DONE] when asked to. With an
    ``engine``, each model it answers is used there first."""

    def __init__(self, statuses: dict[str, int] | None = None, tokens: int = 16, engine: FakeEngine | None = None):
        self.statuses = statuses or {}
        self.tokens = tokens
        self.engine = engine
        self.asked: list[str] = []
        self.headers_seen: list[dict] = []

    async def __call__(self, scope, receive, send):
        message = await receive()
        body = json.loads(message["body"])
        self.asked.append(body["model"])
        if self.engine is not None and self.statuses.get(body["model"], 200) == 200:
            self.engine.use(body["model"])
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


def call(
    split, path="/v1/completions", body=None, headers=(), method="POST", trickle_s: float = 0.0, query=b"", app=None
):
    """(status, headers, body) of one request through ``split``; ``trickle_s``: its body's
    last part comes that long after its first byte, as a slow client sends it; ``query``: its
    query string, as the server hands it over (bytes, not decoded); ``app``: the server's app
    (``FakeEngine.app``), as Starlette puts it in the scope."""
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
        **({"app": app} if app is not None else {}),
    }
    asyncio.run(split(scope, receive, send))
    start = sent[0]
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


def ask(split, user="alice", model=NAME, app=None, **extra):
    return call(split, body={"model": model, "prompt": "hi", "user": user, **extra}, app=app)
