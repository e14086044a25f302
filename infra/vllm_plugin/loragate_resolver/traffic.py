"""The live split inside each replica: which version answers a client's request, the fallback
when it cannot, and the figures of what happened (``--middleware loragate_resolver.traffic.TrafficSplit``).

For ``POST /v1/completions`` and ``/v1/chat/completions`` from a client (no fleet admin key)
naming an adapter of the routing table (``routing``; read from the registry with the
replica's read-only credential every ``LORAGATE_ROUTES_REFRESH_S`` and at once on ``POST
/loragate/routes``), a production replica sends the request to the window's canary for the
user's sticky share and to production otherwise, rewriting the body's model to the name this
replica serves that version under. When the version answers 404, 400 or 5xx -- not loaded,
bytes that fail verification, a load error, no slot -- the answer is swallowed and the
buffered request asked again of production, then of the base model
(``LORAGATE_BASE_MODEL_NAME``), with ``x-loragate-fallback``: the client never sees an error
it did not cause. A breaker per version (``breaker``) keeps a failing or slow version off
this replica for a while. Every answer for an adapter of the table says which version gave
it (``x-loragate-version``) and carries a sealed id (``request_ids``) for feedback, good for
``LORAGATE_FEEDBACK_TTL_S`` and counted once across the fleet by its nonce.

The body is read and parsed once (off the event loop when large), and each rewritten body
written once; a body that is not JSON, nests too deep, or names a ``user`` that is not text
is the client's error (400) before anything else runs. A client may not name a version
(``name@version``: 404, here and on every other route: ``qualified``). The fleet's own
requests (admin key) pass untouched, uncounted. A canary replica only labels and counts.
Figures: ``live_stats`` (``GET /loragate/traffic``, admin key; ``?adapter=NAME``, repeatable,
for only those adapters', ``view=alerts`` for no versions: ``figures``, which serves them off
the event loop) and ``metrics`` (``/metrics``). Each read of the routing table prunes them
(``prune``): an ended window's entries and unrouted versions' go once idle for 15 minutes.
``faults`` is where a test replica's subclass of the split injects errors and delays; here it
is ``NoFaults``, which injects none. Before each version it asks, the split asks the residency
guard whether the engine's adapter cache can take it (``residency``, ``engine_cache``: what is
and is not guarded); after a read of the routes (at most every 15 s) it corrects the guard from the engine and
pins the adapters the registry pins. It counts its requests in flight, for ``base_probe``, which
checks that what it labels the base is the base.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
from datetime import UTC, datetime
from typing import Any

from loragate_resolver import (
    cpu_lora_ops,
    engine_cache,
    fleet_signature,
    metrics,
    read_index,
    registry_reader,
    request_ids,
    residency,
    routing,
    traffic_flow,
)
from loragate_resolver.admin_guard import _error, _read_body, _replay, _respond
from loragate_resolver.base_probe import BaseProbe
from loragate_resolver.breaker import OPEN, Breaker, Limits
from loragate_resolver.figures import document, serve
from loragate_resolver.fleet_signature import header
from loragate_resolver.live_stats import LiveStats

SPLIT_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
TRAFFIC_PATH, FEEDBACK_PATH, ROUTES_PATH = "/loragate/traffic", "/loragate/feedback", "/loragate/routes"
SESSION_HEADER = b"x-loragate-session"
MAX_BODY_BYTES = 4 << 20
MAX_FEEDBACK_BYTES = 64 * 1024
FEEDBACK_KEY_FILE = "feedback-key"
# a body this large is parsed and written off the event loop that streams every other answer
OFF_LOOP_BYTES = 64 * 1024


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def _json_response(payload: Any) -> tuple[int, bytes]:
    return 200, json.dumps(payload).encode()


class NoFaults:
    """What the split injects into a version's answers: nothing. The hook of the test replicas'
    fault injector, a subclass of the split kept out of this package: ``of`` a version (``error``,
    ``delay_ms``) and ``breaker`` limits overridden, empty here."""

    def of(self, version: str) -> dict[str, Any]:
        return {}

    def breaker(self) -> dict[str, Any]:
        return {}


class _Index:
    """The replica's index entries for its role, re-read when the file changes."""

    def __init__(self, adapter_dir: str | None, role: str) -> None:
        self.adapter_dir, self.role = adapter_dir, role
        self._stamp: tuple | None = None
        self._entries: dict = {}

    def version(self, name: str) -> str | None:
        if not self.adapter_dir:
            return None
        try:
            st = os.stat(os.path.join(self.adapter_dir, ".loragate-index.json"))
            stamp: tuple | None = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            stamp = None
        if stamp != self._stamp:
            self._entries = read_index(self.adapter_dir).get("roles", {}).get(self.role, {})
            self._stamp = stamp
        entry = self._entries.get(name)
        version = entry.get("version") if isinstance(entry, dict) else None
        return version if isinstance(version, str) else None


class TrafficSplit:
    """ASGI middleware: see the module docstring."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.secrets_dir = os.environ.get(registry_reader.SECRETS_DIR_VARIABLE)
        self.role = os.environ.get("LORAGATE_REPLICA_ROLE", "production")
        self.index = _Index(os.environ.get("LORAGATE_ADAPTER_DIR"), self.role)
        self.base_name = os.environ.get("LORAGATE_BASE_MODEL_NAME") or None
        self.replica = os.environ.get("LORAGATE_REPLICA_URL")
        self.refresh_s = max(0.05, _env_float("LORAGATE_ROUTES_REFRESH_S", 1.0))
        self.limits = Limits(
            errors=int(_env_float("LORAGATE_BREAKER_ERRORS", 5)),
            slow=int(_env_float("LORAGATE_BREAKER_SLOW", 3)),
            cooldown_s=_env_float("LORAGATE_BREAKER_COOLDOWN_S", 30.0),
        )
        self.feedback_ttl_s = max(1.0, _env_float("LORAGATE_FEEDBACK_TTL_S", 3600.0))
        self.faults = NoFaults()
        self.stats = LiveStats()
        self.breakers: dict[tuple[str, str], Breaker] = {}
        self.routes: dict[str, routing.Route] = {}
        self.guard = residency.from_environment()  # its capacity: the engine's, once the app is seen
        self.engine_cache = engine_cache.EngineCache()
        self.base_probe = BaseProbe()
        self.server_app: Any = None  # the server's app (its state), for the probe's own requests
        self.in_flight: dict[str, int] = {}  # adapter -> its requests through the split now
        self.requests_started = 0
        metrics.base_rows_guarded(cpu_lora_ops.base_rows_guarded())
        self.pins: list[str] = []  # the adapters the registry pins
        self.app_state: Any = None
        self.loaded = False
        self.read_at: datetime | None = None
        self.table_started = -1.0
        self._reading: asyncio.Future | None = None
        self._read_failed = self._pins_failed = False
        self._loop: asyncio.Task | None = None

    # -- the routing table ----------------------------------------------------------------

    async def _read(self) -> bool:
        started = time.monotonic()
        try:
            rows = await asyncio.to_thread(registry_reader.routes_with_pins, self.secrets_dir)
        except registry_reader.NotServable as e:
            if not self._read_failed:  # once per outage: the replica keeps its last table
                logging.getLogger(__name__).warning("loragate: routes not read, last table kept: %s", e)
            self._read_failed = True
            return False
        self.routes = routing.routes_from_rows(rows.production, rows.windows)
        if rows.pins is not None:
            self.pins = rows.pins
        elif not self._pins_failed:  # once per outage: the last pins kept
            logging.getLogger(__name__).warning("loragate: pins not read, last kept: %s", rows.pins_error)
        self._pins_failed = rows.pins is None
        self.table_started, self.read_at, self.loaded = started, datetime.now(UTC), True
        self._read_failed = False
        self.prune()
        return True

    def prune(self) -> None:
        """Drop the figures no route needs any more (``live_stats``: ``LiveStats.prune``) and
        the breakers of versions neither routed nor in the figures, unless open: a version
        nobody is sent to gets no request that would close a breaker past its cooldown."""
        self.stats.prune(self.routes)
        self.guard.prune()
        kept = self.stats.pairs() | {(n, v) for n, r in self.routes.items() for v in (r.production, r.canary) if v}
        limits = self.current_limits()
        for pair in [p for p in self.breakers if p not in kept]:
            if self.breakers[pair].state(limits) != OPEN:
                del self.breakers[pair]

    async def refresh(self) -> bool:
        """One read at a time; callers arriving meanwhile share it."""
        if self._reading is None or self._reading.done():
            self._reading = asyncio.ensure_future(self._read())
        return await asyncio.shield(self._reading)

    async def fresh(self, since: float) -> bool:
        """A table read that started at ``since`` or later (False: the registry was not read)."""
        for _ in range(3):
            if self.table_started >= since:
                return True
            reading = self._reading
            if reading is not None and not reading.done():
                await asyncio.shield(reading)  # it may have started after ``since``
                continue
            if not await self.refresh():
                return False
        return self.table_started >= since

    async def _refresh_forever(self) -> None:
        while True:
            try:
                await self.refresh()
            except Exception:  # never let the loop die: the next round tries again
                logging.getLogger(__name__).exception("loragate: routes refresh failed")
            await self.engine_cache.tend(self)  # off the read requests may wait on; never raises
            try:
                self.base_probe.tick(self)  # starts a probe of the base in the background when due
            except Exception:
                logging.getLogger(__name__).exception("loragate: the base probe could not start")
            await asyncio.sleep(self.refresh_s)

    def _routes_json(self) -> dict[str, Any]:
        return {name: route.as_dict() for name, route in sorted(self.routes.items())}

    # -- ASGI -------------------------------------------------------------------------------

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if self._loop is None:
            self._loop = asyncio.get_running_loop().create_task(self._refresh_forever())
        if self.server_app is None and "app" in scope:
            self.server_app = scope["app"]
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.app_state is None and "app" in scope:
            engine_cache.adopt(self, scope["app"])
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        method = scope.get("method")
        _, receive = await fleet_signature.decide(scope, receive, self.secrets_dir)
        if path in (TRAFFIC_PATH, FEEDBACK_PATH, ROUTES_PATH):
            status, body = await self._own(scope, receive, path, method)
            signed = fleet_signature.answer_headers(scope, status, body, self.secrets_dir)
            return await _respond(send, status, body, signed)
        if method != "POST" or path not in SPLIT_PATHS or self._is_admin(scope):
            return await self.app(scope, receive, send)
        return await self._client(scope, receive, send)

    def _is_admin(self, scope: dict) -> bool:
        return fleet_signature.verdict(scope) == fleet_signature.FLEET

    async def _own(self, scope: dict, receive: Any, path: str, method: str | None) -> tuple[int, bytes]:
        """The middleware's own endpoints (module docstring of ``live_stats`` for the figures)."""
        if path == FEEDBACK_PATH:
            if method != "POST":
                return _error(405, "MethodNotAllowed", "POST only")
            body, too_large = await _read_body(receive, MAX_FEEDBACK_BYTES)
            if too_large:
                return _error(413, "BadRequestError", "feedback too large")
            return self._count_feedback(body)
        if not self._is_admin(scope):
            return _error(401, "AuthenticationError", "the replica's traffic figures need the fleet's admin key")
        if path == ROUTES_PATH:
            if method != "POST":
                return _error(405, "MethodNotAllowed", "POST only")
            if not await self.fresh(time.monotonic()):
                return _error(503, "ServiceUnavailableError", "the registry could not be read; last table kept")
            return _json_response({"routes": self._routes_json(), "read_at": self.read_at and self.read_at.isoformat()})
        if method != "GET":
            return _error(405, "MethodNotAllowed", "GET only")
        return await serve(self, scope)

    def figures(self, query_string: bytes | str = b"", scope: dict | None = None) -> dict[str, Any]:
        """The figures document as ``GET /loragate/traffic?<query_string>`` serves it, built
        on the caller's thread (tests, benches; ``figures.BadQuery`` for a bad query)."""
        return document(self, query_string, scope)

    def feedback_key(self) -> str | None:
        return registry_reader.read_secret(self.secrets_dir, FEEDBACK_KEY_FILE)

    def _count_feedback(self, body: bytes) -> tuple[int, bytes]:
        try:
            asked = json.loads(body)
            request_id, outcome = asked["request_id"], asked["outcome"]
        except (ValueError, KeyError, TypeError, RecursionError):
            return _error(400, "BadRequestError", "request_id and outcome are required")
        if outcome not in ("accepted", "retried"):
            return _error(400, "BadRequestError", "outcome is accepted or retried", "outcome")
        found = request_ids.verify(self.feedback_key(), request_id)
        if found is None:
            return _error(400, "BadRequestError", "not a request id this fleet sealed", "request_id")
        if request_ids.expired(found, self.feedback_ttl_s):
            return _error(400, "BadRequestError", "the request id has expired", "request_id")
        counted = self.stats.feedback(found.adapter, found.version, found.window, outcome, found.nonce)
        return _json_response({"counted": counted, "adapter": found.adapter, "version": found.version})

    def breaker(self, adapter: str, version: str) -> Breaker:
        found = self.breakers.get((adapter, version))
        if found is None:
            found = self.breakers[(adapter, version)] = Breaker()
        return found

    def current_limits(self) -> Limits:
        override = self.faults.breaker()
        if not override:
            return self.limits
        try:
            return Limits(
                errors=int(override.get("errors", self.limits.errors)),
                slow=int(override.get("slow", self.limits.slow)),
                cooldown_s=float(override.get("cooldown_s", self.limits.cooldown_s)),
            )
        except (TypeError, ValueError):
            return self.limits

    # -- a client's request -----------------------------------------------------------------

    async def _client(self, scope: dict, receive: Any, send: Any) -> None:
        arrived = time.monotonic()
        raw, too_large = await _read_body(receive, MAX_BODY_BYTES)
        if too_large:
            return await _respond(send, *_error(413, "BadRequestError", "request body too large"))
        body, refusal = await _parsed(raw)
        if refusal is not None:
            return await _respond(send, *refusal)
        model = body.get("model") if isinstance(body, dict) else None
        if not isinstance(model, str):
            return await self.app(scope, _replay(raw, receive), send)
        if routing.QUALIFIER in model:  # a client never picks a version
            message = f"The model `{model}` does not exist."
            return await _respond(send, *_error(404, "NotFoundError", message, "model"))
        if not self.loaded and (self._reading is None or not self._reading.done()):
            await self.refresh()  # the first read (in flight since start-up, as a rule)
        route = self.routes.get(model)
        index_version = self.index.version(model)
        stale = index_version is not None and (route is None or index_version != route.production)
        if stale and self.role == "production" and not self._read_failed:
            # the index moved since the table was read (a switch, a move the table has not
            # seen yet, an adapter's first production): read it again before sending anyone
            # to the older version, or past the split
            await self.fresh(arrived)
            route = self.routes.get(model)
        if route is None or route.production is None:
            return await self.app(scope, _replay(raw, receive), send)
        assert isinstance(body, dict)
        user = body.get("user")
        if user is not None and not _is_text(user):
            return await _respond(send, *_error(400, "BadRequestError", "user must be text (UTF-8)", "user"))
        if not (isinstance(user, str) and user):
            session = header(scope, SESSION_HEADER)
            user = session.decode("latin-1") if session else secrets.token_hex(8)
        adapter = route.adapter
        self.in_flight[adapter] = self.in_flight.get(adapter, 0) + 1
        self.requests_started += 1
        try:
            await traffic_flow.answer(self, scope, receive, send, body, raw, route, user, index_version)
        finally:  # what the base probe waits out (base_probe)
            self.in_flight[adapter] -= 1
            if not self.in_flight[adapter]:
                del self.in_flight[adapter]


def _is_text(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode()
    except UnicodeEncodeError:  # a lone surrogate: JSON can carry it, UTF-8 cannot
        return False
    return True


async def _parsed(raw: bytes) -> tuple[Any, tuple[int, bytes] | None]:
    """The body as JSON, parsed once (off the event loop when large); a 400 for a body that
    is not JSON or nests deeper than the parser goes. An empty body is left to the app."""
    if not raw:
        return None, None
    try:
        if len(raw) > OFF_LOOP_BYTES:
            return await asyncio.to_thread(json.loads, raw), None
        return json.loads(raw), None
    except (ValueError, RecursionError):
        return None, _error(400, "BadRequestError", "the request body is not a JSON document loragate can read")
