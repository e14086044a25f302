"""The admin guard's rules outside vLLM: each route of a real Starlette app gets its kind and
is answered by it (a route the table does not know is refused, the key included), and what
the guard accepts while the registry cannot be read is bounded in time and by pointer. On
real replicas: tests/test_replica_surface.py and tests/test_replica_admin.py."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from loragate_resolver import admin_guard, qualified, registry_reader  # noqa: E402
from loragate_resolver.surface import KINDS, Kind  # noqa: E402

from tests.support.guard import KEY, guarded_client

NAME = "acme/tiny-llama/support"
FILES = {"adapter_model.safetensors": "a" * 64}


def _app() -> FastAPI:
    app = FastAPI()
    seen: list[tuple[str, bool]] = []

    @app.post("/v1/completions")
    async def completions() -> dict:
        seen.append(("/v1/completions", qualified.allowed(f"{NAME}@v1")))
        return {"ok": True}

    @app.post("/v1/responses")  # an inference route outside the split
    async def responses() -> dict:
        seen.append(("/v1/responses", qualified.allowed(NAME)))
        return {"ok": True}

    @app.post("/invocations")
    async def invocations() -> dict:
        seen.append(("/invocations", qualified.allowed(NAME)))
        return {"ok": True}

    @app.post("/adapters")
    async def sagemaker_loader() -> dict:
        seen.append(("/adapters", True))
        return {"loaded": True}

    @app.post("/v1/unload_lora_adapter")
    async def unload() -> dict:
        seen.append(("/v1/unload_lora_adapter", True))
        return {"ok": True}

    @app.post("/a_route_added_by_a_newer_vllm")
    async def newer() -> dict:
        seen.append(("/a_route_added_by_a_newer_vllm", True))
        return {"ok": True}

    @app.get("/health")
    async def health() -> dict:
        return {}

    app.state.seen = seen
    app.state.openai_serving_models = type("Models", (), {"is_base_model": staticmethod(lambda n: n == "tiny-llama")})()
    return app


@pytest.fixture
def guarded(tmp_path, monkeypatch):
    app = _app()
    with guarded_client(app, tmp_path, monkeypatch) as client:
        yield client, app.state.seen


# (path, with the fleet's key, status, reaches the app)
CASES = [
    ("/v1/completions", False, 200, True),
    ("/adapters", False, 403, False),
    ("/adapters", True, 403, False),
    ("/a_route_added_by_a_newer_vllm", True, 403, False),
    ("/v1/unload_lora_adapter", False, 401, False),
    ("/v1/unload_lora_adapter", True, 200, True),
    ("/nowhere", False, 404, False),  # no route: the router's own 404, nothing runs
]


@pytest.mark.parametrize(("path", "keyed", "status", "reached"), CASES)
def test_each_route_is_answered_by_its_kind(guarded, path, keyed, status, reached):
    client, seen = guarded
    headers = {"x-loragate-admin-key": KEY} if keyed else {}
    assert client.post(path, json={}, headers=headers).status_code == status
    assert any(p == path for p, _ in seen) is reached


def test_the_surface_lists_every_route_and_a_new_one_as_unknown(guarded):
    client, _ = guarded
    assert client.get("/loragate/surface").status_code == 401
    routes = client.get("/loragate/surface", headers={"x-loragate-admin-key": KEY}).json()["routes"]
    kinds = {r["path"]: r["kind"] for r in routes}
    assert kinds["/a_route_added_by_a_newer_vllm"] == "unknown" and kinds["/adapters"] == "refused"
    assert kinds["/v1/completions"] == "split" and kinds["/health"] == "read"


def test_only_the_fleets_key_lets_a_request_reach_a_qualified_name(guarded):
    client, seen = guarded
    client.post("/v1/completions", json={})
    client.post("/v1/completions", json={}, headers={"x-loragate-admin-key": "not-it"})
    client.post("/v1/completions", json={}, headers={"x-loragate-admin-key": KEY})
    assert [allowed for p, allowed in seen if p == "/v1/completions"] == [False, False, True]


def test_no_adapter_answers_a_keyless_client_on_an_inference_route_outside_the_split(guarded):
    client, seen = guarded
    client.post("/v1/completions", json={})
    client.post("/v1/responses", json={})
    client.post("/v1/responses", json={}, headers={"x-loragate-admin-key": KEY})
    assert [(p, allowed) for p, allowed in seen if p != "/v1/completions"] == [
        ("/v1/responses", False),
        ("/v1/responses", True),
    ]


# (headers, body, status, the field refused) of a keyless /invocations
INVOCATIONS = [
    ({"X-Amzn-SageMaker-Adapter-Identifier": NAME}, {"prompt": "hi"}, 400, "x-amzn-sagemaker-adapter-identifier"),
    ({"x-amzn-sagemaker-adapter-identifier": ""}, {"prompt": "hi"}, 400, "x-amzn-sagemaker-adapter-identifier"),
    ({}, {"model": NAME, "prompt": "hi"}, 400, "model"),
    ({}, {"model": f"{NAME}@v1", "prompt": "hi"}, 400, "model"),
    ({}, {"model": ["tiny-llama"], "prompt": "hi"}, 400, "model"),
    ({}, {"model": "tiny-llama", "prompt": "hi"}, 200, None),
    ({}, {"prompt": "hi"}, 200, None),
]


@pytest.mark.parametrize(("headers", "body", "status", "field"), INVOCATIONS)
def test_invocations_answers_the_base_only_and_refuses_naming_anything_else(guarded, headers, body, status, field):
    client, seen = guarded
    answered = client.post("/invocations", json=body, headers=headers)
    assert answered.status_code == status
    if field is not None:
        assert answered.json()["error"]["param"] == field and not seen
    else:
        assert seen == [("/invocations", False)]  # reached, and still no adapter there


def test_the_table_names_the_sagemaker_loader_and_vllms_other_state_changing_routes_refused():
    for path in ("/adapters", "/adapters/{adapter_name}", "/sleep", "/collective_rpc", "/update_weights"):
        assert KINDS[path] == Kind.REFUSED


# -- while the registry cannot be read ----------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def guard(monkeypatch, tmp_path):
    monkeypatch.setenv("LORAGATE_REPLICA_ROLE", "production")
    monkeypatch.setattr(qualified, "install", lambda: True)
    clock = Clock()
    answers: dict[str, object] = {}

    def servable(secrets_dir, role, name, version, owner_moves=None):
        found = answers[version]
        if isinstance(found, Exception):
            raise found
        return found

    monkeypatch.setattr(registry_reader, "servable", servable)
    return admin_guard.AdminGuard(lambda *a: None, clock=clock), clock, answers


DOWN = registry_reader.NotServable("down", "registry_unavailable")


def test_an_outage_accepts_only_a_version_a_pointer_allowed_here_within_the_grace(guard):
    guard, clock, answers = guard
    answers["v1"] = registry_reader.Permission(FILES, by_pointer=True)
    answers["v2"] = registry_reader.Permission(FILES, by_pointer=False)  # a sign-off in flight
    assert guard._expect(NAME, "v1") == FILES and guard._expect(NAME, "v2") == FILES
    answers["v1"] = answers["v2"] = DOWN
    assert guard._expect(NAME, "v1") == FILES  # the revert of a switch the outage interrupted
    with pytest.raises(registry_reader.NotServable):
        guard._expect(NAME, "v2")
    clock.now += admin_guard.OUTAGE_GRACE_S + 1
    with pytest.raises(registry_reader.NotServable):
        guard._expect(NAME, "v1")  # rolled back earlier in the process's life: not any more


def test_a_version_the_registry_refused_since_is_forgotten(guard):
    guard, _, answers = guard
    answers["v1"] = registry_reader.Permission(FILES, by_pointer=True)
    guard._expect(NAME, "v1")
    answers["v1"] = registry_reader.NotServable("no", "not_permitted")  # rolled back
    with pytest.raises(registry_reader.NotServable):
        guard._expect(NAME, "v1")
    answers["v1"] = DOWN
    with pytest.raises(registry_reader.NotServable):
        guard._expect(NAME, "v1")


def test_what_an_outage_remembers_is_bounded(guard, monkeypatch):
    guard, _, answers = guard
    monkeypatch.setattr(admin_guard, "_ALLOWED_MAX", 3)
    for i in range(5):
        answers[f"v{i}"] = registry_reader.Permission(FILES, by_pointer=True)
        guard._expect(NAME, f"v{i}")
    assert [v for _, v in guard._allowed] == ["v2", "v3", "v4"]
