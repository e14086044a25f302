"""The replica obeys only the fleet, and only on the routes loragate drives.

vLLM 0.32 serves its runtime LoRA API and dozens of other state-changing routes (a second
loader under SageMaker's ``/adapters``, sleep, pause, weight updates, cache resets,
profiling, collective RPC, elastic scaling...) to whoever reaches the port; its
``--api-key`` is one key for clients and admin alike. This ASGI middleware
(``--middleware loragate_resolver.admin_guard.AdminGuard``) reads the app's route table at
start-up and gives each route its kind (``surface``), then per request:

- ``read``, ``split`` and ``inference`` routes pass; a qualified name (``name@version``) is
  refused on them unless loragate chose it (``qualified``): a request carrying the fleet's
  admin key runs as chosen (probes and verifications of warm copies); without the key,
  ``/v1/models`` and ``/metrics`` answer less every tenant's name and version
  (``keyless_reads``), an ``inference`` route resolves no adapter at all (the split's two
  routes do), and ``/invocations`` refuses a request naming anything but the base
  (``invocations``);
- ``load`` and ``unload`` need the fleet's signature made with the admin secret
  (``X-Loragate-Signature``, what loragate sends: ``fleet_signature``) or the secret itself in
  its own header, ``X-Loragate-Admin-Key`` (a client's ``Authorization: Bearer`` never
  counts), checked in constant time against ``admin-key`` in the replica's secrets directory
  (``LORAGATE_REPLICA_SECRETS_DIR``, re-read per request so a rotated key takes effect); a load is also checked like a
  resolver load (``loragate_resolver.verified``): the path must lie in the adapter directory
  and hold a version the registry lets this role serve under that name, byte for byte. So
  even the fleet's secret cannot load bytes the registry did not record;
- ``refused`` routes, and any route loragate's table does not know, are refused to everyone,
  the key included (403).

When the registry cannot be read (its database down mid-switch), the fleet's revert must
still put back what the replica served: the admin API then accepts a version the registry
let this process serve *by a pointer* under that name within the last ``OUTAGE_GRACE_S``
(its digests never change; whether it is still right is the fleet's decision, the caller
holds its key). A version the registry refused since, or allowed only by a sign-off in
flight, is not taken; the memory is bounded. The resolver has no such fallback: a volume
writer cannot use an outage.

Refusals use vLLM's error envelope: 401 without the right secret, 403 for a replica with no
admin key (the API is closed), a refused route, or a load the registry refuses.
``GET /loragate/surface`` (admin key) lists every route and its kind.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import OrderedDict
from typing import Any

from loragate_resolver import fleet_signature, invocations, keyless_reads, qualified, registry_reader, verified
from loragate_resolver.fleet_signature import read_body as _read_body
from loragate_resolver.fleet_signature import replay as _replay
from loragate_resolver.surface import OPEN_KINDS, Kind, Surface

SURFACE_PATH = "/loragate/surface"
MAX_BODY_BYTES = 64 * 1024
OUTAGE_GRACE_S = 300.0
_ALLOWED_MAX = 4096

log = logging.getLogger("loragate_resolver.admin_guard")


def _error(status: int, kind: str, message: str, param: str | None = None) -> tuple[int, bytes]:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return status, json.dumps(body).encode()


class AdminGuard:
    """ASGI middleware: see the module docstring."""

    def __init__(self, app: Any, clock: Any = time.monotonic) -> None:
        self.app = app
        self.clock = clock
        self.secrets_dir = os.environ.get(registry_reader.SECRETS_DIR_VARIABLE)
        self.adapter_dir = os.environ.get("LORAGATE_ADAPTER_DIR")
        self.role = os.environ.get("LORAGATE_REPLICA_ROLE")
        self.surface: Surface | None = None
        # (name, version) -> (digests, when the registry allowed it by a pointer), oldest first
        self._allowed: OrderedDict[tuple[str, str], tuple[dict, float]] = OrderedDict()
        if not qualified.install():
            raise RuntimeError("loragate: this vLLM cannot be guarded (no OpenAIServingModels): refusing to start")

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if self.surface is None and "app" in scope:
            self.surface = Surface(list(getattr(scope["app"], "routes", [])))
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        who, receive = await fleet_signature.decide(scope, receive, self.secrets_dir)
        if path == SURFACE_PATH and scope["type"] == "http":
            status, body = self._surface(scope)
            signed = fleet_signature.answer_headers(scope, status, body, self.secrets_dir)
            return await _respond(send, status, body, signed)
        kind = self.surface.kind(scope) if self.surface is not None else Kind.UNKNOWN
        if kind is None or kind in OPEN_KINDS:
            if who == fleet_signature.FLEET:
                with qualified.chosen():  # the fleet's own request (a probe, a verification)
                    return await self.app(scope, receive, send)
            if path in keyless_reads.TENANT_READS and scope["type"] == "http":
                return await keyless_reads.serve_without_tenants(self.app, scope, receive, send, path)
            if kind != Kind.INFERENCE:
                return await self.app(scope, receive, send)
            if path == invocations.PATH and scope["type"] == "http":
                body, too_large = await _read_body(receive, invocations.MAX_BODY_BYTES)
                if too_large:
                    return await _respond(send, *_error(413, "BadRequestError", "request body too large"))
                why = invocations.refusal(scope.get("headers", []), body, invocations.base_names(scope.get("app")))
                if why is not None:
                    return await _respond(send, *_error(400, "BadRequestError", *why))
                receive = _replay(body, receive)
            with qualified.outside_split():  # no adapter answers past the split (qualified)
                return await self.app(scope, receive, send)
        refusal = self._refused(scope, kind, path)
        if refusal is None and kind == Kind.LOAD:
            body, refusal = await self._checked_load(receive)
            if refusal is None:
                receive = _replay(body, receive)
        if refusal is not None:
            log.warning("loragate: refused %s %s: %s", scope.get("method"), path, refusal[0])
            if scope["type"] == "websocket":
                return await send({"type": "websocket.close", "code": 1008})
            return await _respond(send, *refusal)
        with qualified.chosen():
            return await self.app(scope, receive, send)

    def _refused(self, scope: dict, kind: Kind, path: str) -> tuple[int, bytes] | None:
        if kind in (Kind.REFUSED, Kind.UNKNOWN):
            return _error(403, "PermissionDeniedError", f"{path} is not a route loragate lets anyone call", None)
        return self._check_key(scope)

    def _surface(self, scope: dict) -> tuple[int, bytes]:
        refusal = self._check_key(scope)
        if refusal is not None:
            return refusal
        if scope.get("method") != "GET":
            return _error(405, "MethodNotAllowed", "GET only")
        routes = self.surface.as_dicts() if self.surface is not None else []
        return 200, json.dumps({"routes": routes, "guarded": qualified.installed()}).encode()

    def _expect(self, name: str, version: str) -> dict:
        """The registry's expectations; during an outage, those it gave before (module doc)."""
        assert self.role is not None
        try:
            permission = registry_reader.servable(self.secrets_dir, self.role, name, version)
        except registry_reader.NotServable as e:
            known = self._allowed.get((name, version))
            if e.code != "registry_unavailable":
                self._allowed.pop((name, version), None)
                raise
            if known is None or self.clock() - known[1] > OUTAGE_GRACE_S:
                raise
            log.warning("loragate: registry unreachable; %s = %s was allowed here by a pointer before", name, version)
            return known[0]
        if permission.by_pointer:
            self._allowed.pop((name, version), None)
            self._allowed[(name, version)] = (permission.files, self.clock())
            while len(self._allowed) > _ALLOWED_MAX:
                self._allowed.popitem(last=False)
        else:
            self._allowed.pop((name, version), None)
        return permission.files

    def _check_key(self, scope: dict) -> tuple[int, bytes] | None:
        """None for the fleet's request (``fleet_signature.decide`` ran first), else the refusal."""
        who = fleet_signature.verdict(scope)
        if who == fleet_signature.FLEET:
            return None
        closed = who == fleet_signature.CLOSED or (
            registry_reader.read_secret(self.secrets_dir, registry_reader.ADMIN_KEY_FILE) is None
        )
        if closed:
            return _error(403, "PermissionDeniedError", "this replica has no admin key: its admin API is closed")
        return _error(401, "AuthenticationError", "the replica's admin API needs the fleet's key or signature")

    async def _checked_load(self, receive: Any) -> tuple[bytes, tuple[int, bytes] | None]:
        body, too_large = await _read_body(receive, MAX_BODY_BYTES)
        if too_large:
            return b"", _error(413, "BadRequestError", "load request too large")
        try:
            request = json.loads(body)
            name, lora_path = request["lora_name"], request["lora_path"]
        except (ValueError, KeyError, TypeError, RecursionError):
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


async def _respond(send: Any, status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
