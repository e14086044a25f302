"""Every route a real replica exposes is accounted for, and none is a door around the gates.

On the session's real vLLM replicas: each route vLLM registered has a kind in loragate's
table (a new vLLM route fails here instead of opening a door); every state-changing route
but the guarded load and unload is refused to everyone, the fleet's key included -- the
SageMaker ``/adapters`` loader above all, which once loaded never-validated bytes with the
key; and on every inference route a client naming a version (``name@version``) reaches
nothing: the name is never resolved (the fleet's own request, the control, resolves it on
the same route with the same body), and a warm copy is never the one that answers.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from loragate.registry.rules.fleet import qualified_name, version_path
from loragate.tasks.replicas import ADMIN_KEY_HEADER
from tests.support.fleet import SUPPORT_PROMPT, admin_client, answer, served

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": SUPPORT_PROMPT}]
# a body each inference route of vLLM 0.32 accepts, model aside: a route missing here fails
# the walk, so a new route is given one before it is called accounted for
BODIES = {
    "/v1/completions": {"prompt": SUPPORT_PROMPT, "max_tokens": 16},
    "/v1/chat/completions": {"messages": MESSAGES, "max_tokens": 16},
    "/v1/chat/completions/batch": {"messages": [MESSAGES], "max_tokens": 16},
    "/v1/responses": {"input": SUPPORT_PROMPT, "max_output_tokens": 16},
    "/v1/messages": {"messages": MESSAGES, "max_tokens": 16},
    "/v1/messages/count_tokens": {"messages": MESSAGES},
    "/v1/systemone": {"state": SUPPORT_PROMPT, "questions": {"q": {"type": "boolean"}}},
    "/tokenize": {"prompt": SUPPORT_PROMPT},
    "/detokenize": {"tokens": [5, 6, 7]},
    "/invocations": {"prompt": SUPPORT_PROMPT, "max_tokens": 16},
    "/generative_scoring": {"query": SUPPORT_PROMPT, "items": ["a"], "label_token_ids": [5]},
    "/v1/chat/completions/render": {"messages": MESSAGES},
    "/v1/messages/render": {"messages": MESSAGES, "max_tokens": 16},
    "/v1/completions/render": {"prompt": SUPPORT_PROMPT},
    "/v1/responses/render": {"input": SUPPORT_PROMPT},
    "/v1/chat/completions/derender": {"token_ids": [5, 6]},
    "/v1/completions/derender": {"token_ids": [5, 6]},
    "/inference/v1/generate": {"token_ids": [5, 6, 7], "sampling_params": {"max_tokens": 4}},
    "/v1/embeddings": {"input": SUPPORT_PROMPT},
    "/pooling": {"input": SUPPORT_PROMPT},
    "/classify": {"input": SUPPORT_PROMPT},
    "/score": {"text_1": SUPPORT_PROMPT, "text_2": "a"},
    "/v1/score": {"text_1": SUPPORT_PROMPT, "text_2": "a"},
    "/rerank": {"query": SUPPORT_PROMPT, "documents": ["a"]},
    "/v1/rerank": {"query": SUPPORT_PROMPT, "documents": ["a"]},
    "/v2/rerank": {"query": SUPPORT_PROMPT, "documents": ["a"]},
    "/v2/embed": {"texts": [SUPPORT_PROMPT]},
    "/cohere/v2/chat": {"messages": MESSAGES},
}
# inference routes that take no model: a stored response, by its id
NAMES_NO_MODEL = {"/v1/responses/{response_id}/cancel", "/v1/realtime"}
# routes whose handlers resolve a request's model on this tiny base (the control loads it):
# at least these must be shown refusing, so the walk can never pass by finding nothing.
# SageMaker's /invocations answers an unknown name with the base: it never resolves one, but
# it does answer a *loaded* name -- the walk's second half, over a warm copy
RESOLVING = {
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/messages",
    "/tokenize",
    "/detokenize",
    "/generative_scoring",
}


def _key(replica) -> str:
    return (replica.secrets_dir / "admin-key").read_text()


def _surface(replica) -> dict:
    answered = httpx.get(replica.url + "/loragate/surface", headers={ADMIN_KEY_HEADER: _key(replica)}, timeout=30)
    assert answered.status_code == 200, answered.text
    return answered.json()


@pytest.fixture
def previous(fleet):
    """v2 in production, v1 its previous: a version the registry lets production serve as
    ``name@v1`` -- so only the guard stands between a client naming it and its answer."""
    fleet.promote(fleet.v1, "canary")
    fleet.promote(fleet.v1, "production")
    fleet.promote(fleet.v2, "canary")
    fleet.promote(fleet.v2, "production")
    return fleet


@pytest.mark.parametrize("key", ["prod-a", "canary"])
def test_every_route_vllm_registered_has_a_kind_in_loragates_table(replicas, key):
    replica = replicas[key]
    surface = _surface(replica)
    assert surface["guarded"] is True
    unknown = [(r["path"], r["methods"]) for r in surface["routes"] if r["kind"] == "unknown"]
    assert unknown == [], f"routes vLLM registered that loragate's table does not know: {unknown}"
    # the table is the app's own: every documented path is in it
    documented = set(httpx.get(replica.url + "/openapi.json", timeout=30).json()["paths"])
    assert documented <= {r["path"] for r in surface["routes"]}
    inference = {r["path"] for r in surface["routes"] if r["kind"] in ("inference", "split")}
    assert inference - NAMES_NO_MODEL <= set(BODIES), "give each new inference route a body here"
    assert {"/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/adapters"} <= {r["path"] for r in surface["routes"]}


@pytest.fixture
def live_v1(fleet):
    """v1 in production on every replica; v2 validated and signed, in staging."""
    fleet.promote(fleet.v1, "canary")
    fleet.promote(fleet.v1, "production")
    return fleet


def test_every_state_changing_route_but_load_and_unload_is_refused_to_everyone_the_key_included(live_v1):
    replica = live_v1.replicas["prod-a"]
    before = answer(replica.url, live_v1.name)
    refused = [r for r in _surface(replica)["routes"] if r["kind"] == "refused"]
    assert {"/adapters", "/adapters/{adapter_name}"} <= {r["path"] for r in refused}
    # never validated for production: the bytes SageMaker's loader once took with the key
    v2_path = version_path(str(replica.adapter_dir), live_v1.name, live_v1.v2)
    live_v1.registry.materialize(live_v1.v2, Path(v2_path))
    for route in refused:
        path = route["path"].replace("{adapter_name}", "smuggled")
        for method in route["methods"]:
            for headers in ({}, {ADMIN_KEY_HEADER: _key(replica)}):
                body = {"name": "acme/tiny-llama/smuggled", "src": v2_path}
                answered = httpx.request(method, replica.url + path, json=body, headers=headers, timeout=30)
                assert answered.status_code == 403, (method, path, sorted(headers), answered.text)
                assert answered.json()["error"]["type"] == "PermissionDeniedError"
    assert "acme/tiny-llama/smuggled" not in served(replica)
    assert answer(replica.url, live_v1.name) == before


def _answered_as(response: httpx.Response, name: str, text: str) -> bool:
    """Whether ``response`` is the answer of the adapter served as ``name`` (its text is)."""
    if response.status_code != 200:
        return False
    try:
        found = response.json()
    except ValueError:
        return False
    choices = found.get("choices") if isinstance(found, dict) else None
    said = choices[0].get("text") if isinstance(choices, list) and choices and isinstance(choices[0], dict) else None
    return found.get("model") == name or (isinstance(said, str) and said.strip() == text)


def test_no_client_reaches_a_version_by_naming_it_on_any_inference_route(previous):
    replica = previous.replicas["prod-a"]
    warm = qualified_name(previous.name, previous.v1)
    path = version_path(str(replica.adapter_dir), previous.name, previous.v1)
    fleet_headers = {ADMIN_KEY_HEADER: _key(replica)}
    routes = [r["path"] for r in _surface(replica)["routes"] if r["kind"] in ("inference", "split")]
    routes = [r for r in routes if r not in NAMES_NO_MODEL]
    shown_refusing = set()
    with admin_client(previous.registry, replica.url) as fleet:
        for route in routes:
            body = {"model": warm, **BODIES[route]}
            fleet.unload(warm)
            client = httpx.post(replica.url + route, json=body, timeout=60)
            assert warm not in served(replica), f"{route}: a client's request resolved {warm}"
            assert client.status_code != 200 or client.json().get("model") != warm, route
            # the control: the fleet's request, same route, same body, resolves the name
            # wherever the route resolves names at all
            httpx.post(replica.url + route, json=body, headers=fleet_headers, timeout=60)
            if served(replica).get(warm) == path:
                shown_refusing.add(route)
        fleet.unload(warm)
        fleet.load(warm, path)
        v1_text = fleet.complete(warm, SUPPORT_PROMPT, 16, admin=True).text.strip()
        # a warm copy that is loaded is not the one that answers a client either
        for route in routes:
            got = httpx.post(replica.url + route, json={"model": warm, **BODIES[route]}, timeout=60)
            assert not _answered_as(got, warm, v1_text), f"{route} answered a client as {warm}"
        # SageMaker's header names it too: refused, never the warm copy's answer
        named = {"x-amzn-sagemaker-adapter-identifier": warm}
        got = httpx.post(replica.url + "/invocations", json=BODIES["/invocations"], headers=named, timeout=60)
        assert got.status_code == 400 and not _answered_as(got, warm, v1_text), got.text
    assert shown_refusing >= RESOLVING, f"the control resolved the name only on {sorted(shown_refusing)}"


def test_no_client_reaches_an_adapter_past_the_split_on_any_inference_route(live_v1):
    """An adapter answers a client only through the split and its residency guard: on every
    other inference route its plain name resolves nothing (the fleet's request, the control,
    loads it on the same route with the same body), and SageMaker's ``/invocations`` refuses a
    header or a body naming anything but the base -- the loads past the guard's cap it once made."""
    replica, name = live_v1.replicas["prod-a"], live_v1.name
    fleet_headers = {ADMIN_KEY_HEADER: _key(replica)}
    routes = [r["path"] for r in _surface(replica)["routes"] if r["kind"] == "inference"]
    routes = [r for r in routes if r not in NAMES_NO_MODEL]
    assert "/invocations" in routes
    shown_refusing = set()
    with admin_client(live_v1.registry, replica.url) as fleet:
        for route in routes:
            body = {"model": name, **BODIES[route]}
            fleet.unload(name)
            client = httpx.post(replica.url + route, json=body, timeout=60)
            assert name not in served(replica), f"{route}: a client's request loaded {name} past the split"
            assert client.status_code != 200 or client.json().get("model") != name, route
            httpx.post(replica.url + route, json=body, headers=fleet_headers, timeout=60)
            if name in served(replica):
                shown_refusing.add(route)
        fleet.unload(name)
        header = "x-amzn-sagemaker-adapter-identifier"
        for headers, body, field in (
            ({header: name}, BODIES["/invocations"], header),
            ({}, {"model": name, **BODIES["/invocations"]}, "model"),
        ):
            refused = httpx.post(replica.url + "/invocations", json=body, headers=headers, timeout=60)
            assert (refused.status_code, refused.json()["error"]["param"]) == (400, field), refused.text
            assert name not in served(replica)
        base = httpx.post(replica.url + "/invocations", json=BODIES["/invocations"], timeout=60)
        assert base.status_code == 200 and base.json()["model"] != name
    # the split's own routes still answer the adapter
    assert answer(replica.url, name)
    assert shown_refusing >= RESOLVING - {"/v1/completions", "/v1/chat/completions"}, sorted(shown_refusing)
