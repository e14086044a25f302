"""Every route a replica exposes, accounted for: what each one is, and so what a caller may do.

vLLM registers dozens of routes beside the two loragate drives (the SageMaker ``/adapters``
loader, sleep, weight updates, cache resets, elastic scaling, profiling...), and each
release adds more. At start-up the admin guard reads the app's own route table and gives
every route one kind from ``KINDS``, keyed by the route's path template:

- ``read``: answers without changing anything (health, models, metrics, version);
- ``split``: inference the live split routes (``traffic.TrafficSplit``);
- ``inference``: runs the model for a client, outside the split -- no adapter resolves there
  without the fleet's key (``qualified``), so the only way to an adapter is the split;
- ``load`` / ``unload``: the runtime LoRA API, for the fleet's key only, a load's bytes
  checked against the registry (``admin_guard``);
- ``refused``: changes the server's state in a way loragate never asks for: refused to
  everyone, the fleet's key included.

A route the table does not name is refused too, and logged at start-up: a new vLLM route is
closed until someone decides what it is (``GET /loragate/surface`` lists the table a replica
built, and a test walks it on a real replica).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

log = logging.getLogger("loragate_resolver.surface")


class Kind(StrEnum):
    READ = "read"
    SPLIT = "split"
    INFERENCE = "inference"
    LOAD = "load"
    UNLOAD = "unload"
    REFUSED = "refused"
    UNKNOWN = "unknown"  # not in KINDS: refused like REFUSED, and reported


_READ = (
    "/openapi.json",
    "/docs",
    "/docs/oauth2-redirect",
    "/redoc",
    "/static",
    "/health",
    "/load",
    "/version",
    "/kv_event_sources",
    "/metrics",
    "/ping",  # SageMaker's health check (GET and POST)
    "/v1/models",
    "/v1/responses/{response_id}",  # a stored response, by its id
    "/tokenizer_info",
    "/server_info",
    "/is_sleeping",
    "/is_paused",
    "/weight_info",
    "/get_world_size",
    "/fault_tolerance/status",
)
_SPLIT = ("/v1/completions", "/v1/chat/completions")
_INFERENCE = (
    "/v1/chat/completions/batch",
    "/v1/chat/completions/render",
    "/v1/chat/completions/derender",
    "/v1/completions/render",
    "/v1/completions/derender",
    "/v1/responses",
    "/v1/responses/render",
    "/v1/responses/{response_id}/cancel",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/messages/render",
    "/v1/systemone",
    "/v1/embeddings",
    "/v1/score",
    "/v1/rerank",
    "/v2/rerank",
    "/v2/embed",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
    "/v1/realtime",
    "/cohere/v2/chat",
    "/rerank",
    "/score",
    "/pooling",
    "/classify",
    "/tokenize",
    "/detokenize",
    "/generative_scoring",
    "/inference/v1/generate",
    "/invocations",  # SageMaker's: dispatches to the handlers above, in process
)
_REFUSED = (
    "/adapters",  # SageMaker's second loader: a path of the caller's choosing
    "/adapters/{adapter_name}",
    "/abort_requests",
    "/inference/v1/abort_requests",
    "/scale_elastic_ep",
    "/is_scaling_elastic_ep",
    "/sleep",
    "/wake_up",
    "/release_kv_cache_memory",
    "/pause",
    "/resume",
    "/collective_rpc",
    "/reset_prefix_cache",
    "/reset_mm_cache",
    "/reset_encoder_cache",
    "/start_profile",
    "/stop_profile",
    "/init_weight_transfer_engine",
    "/shutdown_weight_transfer_engine",
    "/start_weight_update",
    "/start_draft_weight_update",
    "/update_weights",
    "/finish_weight_update",
    "/update_weight_version",
    "/weight_checker",
    "/fault_tolerance/apply",
)
KINDS: dict[str, Kind] = {
    **dict.fromkeys(_READ, Kind.READ),
    **dict.fromkeys(_SPLIT, Kind.SPLIT),
    **dict.fromkeys(_INFERENCE, Kind.INFERENCE),
    **dict.fromkeys(_REFUSED, Kind.REFUSED),
    "/v1/load_lora_adapter": Kind.LOAD,
    "/v1/unload_lora_adapter": Kind.UNLOAD,
}
# answered by a caller that never reaches the app's routes with them
OPEN_KINDS = frozenset({Kind.READ, Kind.SPLIT, Kind.INFERENCE})
_CACHED = 1024  # (type, method, path) -> kind of paths without parameters, most of the traffic


@dataclass(frozen=True)
class Entry:
    path: str
    methods: tuple[str, ...]
    kind: Kind
    route: Any

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "methods": list(self.methods), "kind": self.kind.value}


def kind_of(path: str) -> Kind:
    return KINDS.get(path, Kind.UNKNOWN)


def entries(routes: list[Any]) -> list[Entry]:
    """The app's routes (Starlette's ``Route``, ``APIRoute``, ``WebSocketRoute``, ``Mount``) with
    their kinds, in the router's order."""
    found = []
    for route in routes:
        path = getattr(route, "path", None)
        if not isinstance(path, str):
            continue
        methods = getattr(route, "methods", None)
        shown = tuple(sorted(methods)) if methods else ("WEBSOCKET",) if _is_websocket(route) else ("*",)
        found.append(Entry(path, shown, kind_of(path), route))
    return found


def _is_websocket(route: Any) -> bool:
    return type(route).__name__ == "WebSocketRoute"


class Surface:
    """The app's routes and their kinds; ``kind`` answers which one a request would reach."""

    def __init__(self, routes: list[Any]) -> None:
        self.entries = entries(routes)
        self._cache: dict[tuple[str, str, str], Kind | None] = {}
        unknown = [e for e in self.entries if e.kind == Kind.UNKNOWN]
        for entry in unknown:
            log.warning("loragate: route %s %s is not in loragate's table: refused", entry.path, entry.methods)

    def kind(self, scope: dict) -> Kind | None:
        """The kind of the route the app's router would hand ``scope`` to, matched as the router
        matches it; None when it hands it to none (a 404, a 405 or a redirect: nothing runs)."""
        key = (scope["type"], scope.get("method") or "", scope["path"])
        if key in self._cache:
            return self._cache[key]
        from starlette.routing import Match

        found: Kind | None = None
        parameters = False
        for entry in self.entries:
            match, child = entry.route.matches(scope)
            if match is Match.FULL:
                found = entry.kind
                parameters = bool(child.get("path_params"))
                break
        if not parameters:
            if len(self._cache) >= _CACHED:
                self._cache.clear()
            self._cache[key] = found
        return found

    def as_dicts(self) -> list[dict[str, Any]]:
        return [e.as_dict() for e in self.entries]
