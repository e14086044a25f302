"""The replica obeys only the fleet: its admin API needs a secret only the fleet control holds.

vLLM 0.32 serves its runtime LoRA API (``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``)
and other state-changing endpoints (sleep, pause, weight updates, cache resets, profiling,
collective RPC...) to whoever reaches the port; its ``--api-key`` is one key for clients and
admin alike. This ASGI middleware (``--middleware loragate_resolver.admin_guard.AdminGuard``)
lets through reads (GET, HEAD, OPTIONS), websockets and the inference endpoints listed in
``INFERENCE_PATHS``; every other request must carry the admin secret in its own header,
``X-Loragate-Admin-Key`` (a client's ``Authorization: Bearer`` never counts), compared in
constant time with ``admin-key`` in the replica's secrets directory
(``LORAGATE_REPLICA_SECRETS_DIR``, re-read per request so a rotated key takes effect). Unknown
paths are admin paths: a new vLLM endpoint is closed until listed.

A load is also checked like a resolver load (``loragate_resolver.verified``): the path must lie
in the adapter directory and hold a version the registry lets this role serve under that
name, byte for byte. So even the fleet's secret cannot load bytes the registry did not record.

When the registry cannot be read (its database down mid-switch), the fleet's revert must
still put back what the replica served: the admin API then accepts a version this process
was allowed to serve under that name before (its digests never change; whether it is still
the right one is the fleet's decision, the caller holds its key). The resolver has no such
fallback: a volume writer cannot use an outage.

Refusals use vLLM's error envelope: 401 without the right secret, 403 for a replica with no
admin key (the API is closed) or a load the registry refuses.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
from typing import Any

from loragate_resolver import registry_expectations, registry_reader, verified

HEADER = b"x-loragate-admin-key"
LOAD_PATH = "/v1/load_lora_adapter"
MAX_BODY_BYTES = 64 * 1024
# what clients may call without the admin secret (an exact path, or a prefix ending in "/")
INFERENCE_PATHS = (
    "/v1/completions",
    "/v1/completions/",
    "/v1/chat/completions",
    "/v1/chat/completions/",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/responses/",
    "/v1/messages",
    "/v1/messages/",
    "/v1/score",
    "/v1/rerank",
    "/v1/audio/",
    "/v2/rerank",
    "/v2/embed",
    "/cohere/v2/chat",
    "/rerank",
    "/score",
    "/pooling",
    "/classify",
    "/tokenize",
    "/detokenize",
    "/generative_scoring",
    "/inference/v1/generate",
    "/invocations",
    "/ping",
)

log = logging.getLogger("loragate_resolver.admin_guard")


def is_inference(path: str) -> bool:
    return any(path.startswith(p) if p.endswith("/") else path == p for p in INFERENCE_PATHS)


def key_matches(presented: bytes | None, expected: str) -> bool:
    """Constant time in the key's content (both sides hashed first: equal lengths)."""
    if presented is None:
        return False
    return hmac.compare_digest(hashlib.sha256(presented).digest(), hashlib.sha256(expected.encode()).digest())


def _error(status: int, kind: str, message: str, param: str | None = None) -> tuple[int, bytes]:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return status, json.dumps(body).encode()


class AdminGuard:
    """ASGI middleware: see the module docstring."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.secrets_dir = os.environ.get(registry_reader.SECRETS_DIR_VARIABLE)
        self.adapter_dir = os.environ.get("LORAGATE_ADAPTER_DIR")
        self.role = os.environ.get("LORAGATE_REPLICA_ROLE")
        # (name, version) -> digests the registry allowed on an admin load, for an outage
        self._allowed: dict[tuple[str, str], dict] = {}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if is_inference(path):
            return await self.app(scope, receive, send)
        refusal = self._check_key(scope)
        if refusal is None and path == LOAD_PATH:
            body, refusal = await self._checked_load(receive)
            if refusal is None:
                receive = _replay(body, receive)
        if refusal is not None:
            log.warning("loragate: refused %s %s: %s", scope.get("method"), path, refusal[0])
            return await _respond(send, *refusal)
        return await self.app(scope, receive, send)

    def _expect(self, name: str, version: str) -> dict:
        """The registry's expectations; during an outage, those it gave before (module doc)."""
        assert self.role is not None
        try:
            files = registry_expectations(self.role, self.secrets_dir)(name, version)
        except registry_reader.NotServable as e:
            known = self._allowed.get((name, version))
            if e.code != "registry_unavailable" or known is None:
                raise
            log.warning("loragate: registry unreachable; %s = %s was allowed here before", name, version)
            return known
        if len(self._allowed) >= 4096:
            self._allowed.clear()
        self._allowed[(name, version)] = files
        return files

    def _check_key(self, scope: dict) -> tuple[int, bytes] | None:
        expected = registry_reader.read_secret(self.secrets_dir, registry_reader.ADMIN_KEY_FILE)
        if expected is None:
            return _error(403, "PermissionDeniedError", "this replica has no admin key: its admin API is closed")
        presented = next((value for name, value in scope.get("headers", []) if name.lower() == HEADER), None)
        if not key_matches(presented, expected):
            return _error(401, "AuthenticationError", "the replica's admin API needs the fleet's admin key")
        return None

    async def _checked_load(self, receive: Any) -> tuple[bytes, tuple[int, bytes] | None]:
        chunks, size = [], 0
        while True:
            message = await receive()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                return b"", _error(413, "BadRequestError", "load request too large")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            request = json.loads(body)
            name, lora_path = request["lora_name"], request["lora_path"]
        except (ValueError, KeyError, TypeError):
            return body, _error(400, "BadRequestError", "lora_name and lora_path are required", "lora_path")
        if not (isinstance(name, str) and isinstance(lora_path, str) and self.adapter_dir and self.role):
            return body, _error(403, "PermissionDeniedError", "this replica loads nothing the registry did not record")
        version = await asyncio.to_thread(verified, self.adapter_dir, name, lora_path, self._expect)
        if version is None:
            return body, _error(
                403,
                "PermissionDeniedError",
                f"{lora_path} is not a version the registry lets this {self.role} replica serve as {name}",
                "lora_path",
            )
        return body, None


def _replay(body: bytes, original: Any) -> Any:
    """A ``receive`` that hands the app the body already read, then what the server sends."""
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await original()

    return receive


async def _respond(send: Any, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
