"""What a client sends, however it sends it, outside vLLM: a malformed request is the
client's 400 naming the field, a large body is parsed once and rewritten once off the event
loop, and only a request the split forwards may reach a qualified name."""

from __future__ import annotations

import asyncio
import json

import pytest
from loragate_resolver import qualified, traffic

from tests.support.split import (
    NAME,
    FakeVllm,
    _split,
    ask,
    call,
    window,
)

DEEP = b"[" * 200_000 + b"]" * 200_000
MALFORMED = [
    ("a-lone-surrogate-as-user", b'{"model": "%s", "prompt": "x", "user": "\\ud800"}' % NAME.encode(), "user"),
    ("nesting-deeper-than-the-parser", b'{"model": "%s", "prompt": %s}' % (NAME.encode(), DEEP), None),
    ("not-json", b'{"model": "%s", "prompt": ' % NAME.encode(), None),
]


@pytest.mark.parametrize(("case", "raw", "param"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_request_is_the_clients_400_naming_the_field_and_reaches_no_version(split_env, case, raw, param):
    app = FakeVllm()
    split = _split(app, window(9, "c1", 1.0))
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "server": ("h", 1)}
    asyncio.run(split(scope, receive, send))
    error = json.loads(sent[1]["body"])["error"]
    assert sent[0]["status"] == 400 and error["param"] == param and app.asked == []
    assert split.stats.versions == {}


def test_a_large_request_is_parsed_once_and_each_rewrite_written_once_off_the_event_loop(split_env, monkeypatch):
    """Once a 4 MiB body was parsed and rewritten on the event loop that streams every other
    answer, once per version asked; vLLM itself still parses what each version is sent."""
    import threading

    parsed, written = [], []
    real_loads, real_dumps = json.loads, json.dumps

    class Counting:
        @staticmethod
        def loads(raw, *args, **kwargs):
            parsed.append((len(raw), threading.get_ident()))
            return real_loads(raw, *args, **kwargs)

        @staticmethod
        def dumps(value, *args, **kwargs):
            model = value.get("model") if isinstance(value, dict) else None
            written.append((model, threading.get_ident()))
            return real_dumps(value, *args, **kwargs)

    from loragate_resolver import traffic_flow

    monkeypatch.setattr(traffic, "json", Counting)
    monkeypatch.setattr(traffic_flow, "json", Counting)
    app = FakeVllm({f"{NAME}@c1": 404, NAME: 503})  # the canary and production fail: three versions asked
    status, headers, _ = ask(_split(app, window(9, "c1", 1.0)), prompt="x" * 200_000)
    assert status == 200 and headers[b"x-loragate-version"] == b"base"
    assert app.asked == [f"{NAME}@c1", NAME, "tiny-llama"]
    loop = threading.get_ident()  # asyncio.run ran the split in this thread
    requests_parsed = [thread for size, thread in parsed if size > 200_000]  # the answers' bodies aside
    assert len(requests_parsed) == 1 and requests_parsed[0] != loop
    rewrites = [(model, thread) for model, thread in written if model]
    assert sorted(m for m, _ in rewrites) == sorted([f"{NAME}@c1", "tiny-llama"])  # the plain name: as sent
    assert all(thread != loop for _, thread in rewrites)


class ChoiceRecorder(FakeVllm):
    """Records whether a qualified name would be visible to vLLM for each request."""

    def __init__(self) -> None:
        super().__init__()
        self.chosen: list[bool] = []

    async def __call__(self, scope, receive, send):
        self.chosen.append(qualified.allowed(f"{NAME}@c1"))
        await super().__call__(scope, receive, send)


def test_only_a_request_the_split_forwards_may_reach_a_qualified_name(split_env):
    app = ChoiceRecorder()
    split = _split(app, window(9, "c1", 1.0))
    ask(split)  # the split chose the canary's qualified name
    ask(split, model="tiny-llama")  # not the split's: passed as it came
    call(split, path="/v1/embeddings", body={"model": NAME})
    assert app.chosen == [True, False, False]
    assert not qualified.allowed(f"{NAME}@c1")  # nothing leaks out of a request


def test_the_split_sees_the_warm_copies_a_client_cannot_name():
    """The split picks ``name@version`` where the plain name is gone and the warm copy is
    loaded (a move that only changed where users go); the guard that hides the copy from
    clients must not hide it from the split's own choice."""
    from types import SimpleNamespace

    from loragate_resolver import routing, traffic_flow

    table = qualified.GuardedAdapters({f"{NAME}@v1": object()})
    scope = {"app": SimpleNamespace(state=SimpleNamespace(openai_serving_models=SimpleNamespace(lora_requests=table)))}
    loaded = traffic_flow.loaded_names(scope)
    assert f"{NAME}@v1" not in table  # what a client's request sees
    assert routing.served_name(NAME, "v1", "v1", loaded) == f"{NAME}@v1"
