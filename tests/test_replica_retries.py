"""The replica client's one retry policy: idempotent requests are tried again on a transport
failure or a 5xx, after 0.2 s, 0.4 s, ...; a refusal (4xx) and a request that is not
idempotent are not; the last failure is the typed ReplicaError, never a RetryError.

The replica is an ``httpx.MockTransport`` answering from a list; the waits are recorded
instead of slept.
"""

from __future__ import annotations

import time

import httpx
import pytest

from loragate.registry.errors import ErrorCode, ReplicaError
from loragate.tasks.replicas import ReplicaClient

MODELS = {"data": [{"id": "tiny-llama", "root": "/m", "parent": None}]}


def _client(answers: list, retries: int = 2) -> tuple[ReplicaClient, list[str]]:
    """A client whose requests get ``answers`` in turn: a status (with a vLLM error
    envelope), a JSON body (200), or an exception to raise."""
    calls: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(f"{request.method} {request.url.path}")
        answer = answers[min(len(calls), len(answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, int):
            kind = "NotFoundError" if answer == 404 else "BadRequestError" if answer < 500 else "InternalServerError"
            return httpx.Response(answer, json={"error": {"message": "no", "type": kind}})
        return httpx.Response(200, json=answer)

    return ReplicaClient("http://replica:8000", retries=retries, transport=httpx.MockTransport(handle)), calls


@pytest.fixture
def waits(monkeypatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    return slept


def test_an_idempotent_read_is_retried_on_5xx_with_a_linear_back_off(waits):
    client, calls = _client([503, 502, MODELS])
    assert [m.id for m in client.models()] == ["tiny-llama"]
    assert calls == ["GET /v1/models"] * 3
    assert waits == pytest.approx([0.2, 0.4])


def test_transport_errors_are_retried_then_raised_as_replica_unavailable(waits):
    client, calls = _client([httpx.ConnectError("refused")])
    with pytest.raises(ReplicaError) as err:
        client.models()
    assert (err.value.code, err.value.field, err.value.status) == (ErrorCode.REPLICA_UNAVAILABLE, "url", 0)
    assert "unreachable on GET /v1/models: ConnectError" in err.value.message
    assert len(calls) == 3 and waits == pytest.approx([0.2, 0.4])


def test_a_5xx_on_the_last_attempt_is_raised_with_its_status(waits):
    client, calls = _client([500], retries=3)
    with pytest.raises(ReplicaError) as err:
        client.metric("vllm:prefix_cache_hits")
    assert (err.value.code, err.value.status) == (ErrorCode.REPLICA_UNAVAILABLE, 500)
    assert len(calls) == 4 and waits == pytest.approx([0.2, 0.4, 0.6])


@pytest.mark.parametrize(
    ("status", "code"), [(400, ErrorCode.REPLICA_REFUSED), (404, ErrorCode.REPLICA_UNKNOWN_ADAPTER)]
)
def test_a_refusal_is_not_retried(waits, status, code):
    client, calls = _client([status, MODELS])
    with pytest.raises(ReplicaError) as err:
        client.models()
    assert (err.value.code, err.value.status) == (code, status)
    assert len(calls) == 1 and waits == []


def test_a_request_that_is_not_idempotent_is_sent_once(waits):
    client, calls = _client([503, "loaded"])
    with pytest.raises(ReplicaError) as err:
        client.load("acme/tiny-llama/support", "/adapters/v1")
    assert err.value.code == ErrorCode.REPLICA_UNAVAILABLE
    assert calls == ["POST /v1/load_lora_adapter"] and waits == []


def test_no_retries_means_one_attempt(waits):
    client, calls = _client([httpx.ReadTimeout("slow")], retries=0)
    assert client.health() is False
    assert calls == ["GET /health"] and waits == []
