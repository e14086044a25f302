"""The fleet signs its requests to a replica and never sends the key; the replica signs its
figures back (``loragate/tasks/replica_signatures.py``, the plugin's ``fleet_signature.py``).

Outside vLLM: the two implementations agree; a signature is taken once, within a minute of
the replica's clock, and never for another method, path, query or body, or under another
key. On a real replica, behind a proxy registered in the fleet's place (the pentest's rogue
replica): the proxy never sees the key, a signed request it saw and sends again is refused,
and figures it rewrites are refused as unverified by the fleet.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from loragate_resolver import fleet_signature

from loragate.registry.errors import ErrorCode, ReplicaError
from loragate.tasks.replica_signatures import SIGNATURE_HEADER, answer_signed, sign_request, signing_key
from loragate.tasks.replicas import ADMIN_KEY_HEADER, ReplicaClient
from tests.support import split as _plugin_on_the_path  # noqa: F401  # puts the plugin on sys.path

KEY = "k" * 43


@pytest.fixture
def secrets_dir(tmp_path):
    (tmp_path / "admin-key").write_text(KEY)
    return str(tmp_path)


def scope_of(method: str, target: bytes, signature: str | None, key_header: str | None = None) -> dict:
    """The ASGI scope a server builds for a request to ``target`` (raw path and query)."""
    path, _, query = target.partition(b"?")
    headers = [(b"host", b"replica")]
    if signature is not None:
        headers.append((b"x-loragate-signature", signature.encode()))
    if key_header is not None:
        headers.append((b"x-loragate-admin-key", key_header.encode()))
    return {"type": "http", "method": method, "path": path.decode(), "raw_path": path, "query_string": query,
            "headers": headers}  # fmt: skip


def decided(scope: dict, body: bytes, secrets_dir: str, at: float | None = None) -> str:
    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    clock = (lambda: at) if at is not None else time.time
    verdict, replayed = asyncio.run(fleet_signature.decide(scope, receive, secrets_dir, clock))
    if body:  # the app still reads the whole body the signature covered
        assert asyncio.run(replayed())["body"] == body
    return verdict


TARGET = b"/loragate/traffic?adapter=acme%2Ftiny-llama%2Fsupport&view=alerts"
BODY = b'{"lora_name": "acme/tiny-llama/support"}'

# (what the request the replica receives changes from the one signed, its verdict)
CHANGED = [
    ("nothing", {}, "fleet"),
    ("the-method", {"method": "POST"}, "wrong"),
    ("the-path", {"target": b"/loragate/routes?adapter=acme%2Ftiny-llama%2Fsupport&view=alerts"}, "wrong"),
    ("the-query", {"target": b"/loragate/traffic?adapter=acme%2Ftiny-llama%2Fother&view=alerts"}, "wrong"),
    ("the-body", {"body": b'{"lora_name": "acme/tiny-llama/other"}'}, "wrong"),
    ("the-key", {"key": "q" * 43}, "wrong"),
    ("the-clock-61-s-on", {"at_offset": 61.0}, "wrong"),
    ("the-clock-59-s-on", {"at_offset": 59.0}, "fleet"),
]  # fmt: skip


@pytest.mark.parametrize(("changed", "verdict"), [c[1:] for c in CHANGED], ids=[c[0] for c in CHANGED])
def test_a_signature_is_taken_only_for_the_request_signed_under_the_fleets_key(secrets_dir, changed, verdict):
    signed_at = 1_800_000_000.0
    key = signing_key(changed.get("key", KEY))
    value, _ = sign_request(key, "GET", TARGET, BODY, at=signed_at)
    scope = scope_of(changed.get("method", "GET"), changed.get("target", TARGET), value)
    at = signed_at + changed.get("at_offset", 0.5)
    assert decided(scope, changed.get("body", BODY), secrets_dir, at) == verdict


def test_a_signature_seen_once_is_refused_the_second_time(secrets_dir):
    value, _ = sign_request(signing_key(KEY), "POST", b"/v1/load_lora_adapter", BODY)
    assert decided(scope_of("POST", b"/v1/load_lora_adapter", value), BODY, secrets_dir) == "fleet"
    assert decided(scope_of("POST", b"/v1/load_lora_adapter", value), BODY, secrets_dir) == "wrong"


def test_the_key_itself_is_still_taken_a_wrong_one_or_none_is_not_and_a_keyless_replica_is_closed(
    secrets_dir, tmp_path
):
    assert decided(scope_of("GET", b"/loragate/traffic", None, KEY), b"", secrets_dir) == "fleet"
    assert decided(scope_of("GET", b"/loragate/traffic", None, "x" * 43), b"", secrets_dir) == "wrong"
    assert decided(scope_of("GET", b"/loragate/traffic", None), b"", secrets_dir) == "none"
    empty = tmp_path / "none"
    empty.mkdir()
    assert decided(scope_of("GET", b"/loragate/traffic", None, KEY), b"", str(empty)) == "closed"


def test_the_answer_to_a_signed_request_is_signed_for_it_and_for_no_other_body_or_request(secrets_dir):
    value, nonce = sign_request(signing_key(KEY), "GET", TARGET, b"")
    scope = scope_of("GET", TARGET, value)
    assert decided(scope, b"", secrets_dir) == "fleet"
    body = json.dumps({"versions": []}).encode()
    [(name, signature)] = fleet_signature.answer_headers(scope, 200, body, secrets_dir)
    assert name == b"x-loragate-answer-signature"
    assert answer_signed(signing_key(KEY), nonce, 200, body, signature.decode())
    assert not answer_signed(signing_key(KEY), nonce, 200, body + b" ", signature.decode())
    assert not answer_signed(signing_key(KEY), "0" * 32, 200, body, signature.decode())
    keyed = scope_of("GET", TARGET, None, KEY)  # no nonce: nothing to sign the answer for
    assert (
        decided(keyed, b"", secrets_dir) == "fleet"
        and fleet_signature.answer_headers(keyed, 200, body, secrets_dir) == []
    )


# -- on a real replica, behind a rogue proxy ----------------------------------------------------


class RogueProxy:
    """Forwards everything to ``upstream`` and keeps what it saw; ``rewrite`` changes the body
    of an answer to ``/loragate/traffic`` before it goes back."""

    def __init__(self, upstream: str) -> None:
        self.upstream, self.seen, self.rewrite = upstream, [], None
        self._client = httpx.Client(base_url=upstream, timeout=60)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                proxy.seen.append((self.command, self.path, headers, body))
                answer = proxy._client.request(self.command, self.path, content=body, headers=headers)
                content = answer.content
                if proxy.rewrite is not None and self.path.startswith("/loragate/traffic"):
                    content = json.dumps(proxy.rewrite(answer.json())).encode()
                self.send_response(answer.status_code)
                for k, v in answer.headers.items():
                    if k.lower() not in ("content-length", "content-encoding", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = _forward

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self._client.close()


@pytest.fixture
def rogue(replicas):
    replica = replicas["prod-a"]
    proxy = RogueProxy(replica.url)
    yield replica, proxy, (replica.secrets_dir / "admin-key").read_text()
    proxy.close()


@pytest.mark.slow
def test_a_proxy_in_front_of_a_replica_never_sees_the_key_and_cannot_replay_or_rewrite_what_it_relays(rogue):
    replica, proxy, key = rogue
    with ReplicaClient(proxy.url, admin_key=key) as fleet:
        figures = fleet.traffic(alerts_only=True)  # relayed as it was: signed by the replica
        assert "fallback_15m" in figures
        proxy.rewrite = lambda document: {**document, "alerts": [{"kind": "made_up"}]}
        with pytest.raises(ReplicaError) as refused:
            fleet.traffic(alerts_only=True)
        assert refused.value.code == ErrorCode.REPLICA_UNVERIFIED
    assert proxy.seen and all(key not in json.dumps(headers) + body.decode() for _, _, headers, body in proxy.seen)
    assert all(ADMIN_KEY_HEADER.lower() not in {k.lower() for k in headers} for _, _, headers, _ in proxy.seen)
    method, path, headers, body = proxy.seen[0]
    assert SIGNATURE_HEADER.lower() in {k.lower() for k in headers}
    again = httpx.request(method, replica.url + path, content=body, headers=headers, timeout=30)
    assert again.status_code == 401, again.text  # what the proxy saw, sent again: refused
