"""The replica's figures document (``GET /loragate/traffic``, the fleet's key): what a query
asks for, a snapshot taken on the event loop, the JSON written off it.

The query: ``adapter=NAME`` (repeatable, URL-encoded) keeps only those adapters' ``versions``,
``routes``, ``alerts`` and ``fallback_15m_by_adapter``; ``view=alerts`` leaves ``versions``
empty, for a watch that needs only the alerts and fallback rates. No parameter: everything.
Any other parameter or value, or a query that is not UTF-8, is a 400; an adapter this replica
has not seen is no error (it has no figures yet). The document: ``replica``, ``role``,
``routes``, ``routes_read_at``, ``versions`` (``live_stats.VersionStats`` with its breaker's
state and trips), ``alerts``, ``fallback_15m`` (the replica's, every adapter's),
``fallback_15m_by_adapter``, ``kept`` (entries held, ended-window entries dropped so far) and
``residency`` (the adapter cache's guard: ``residency.ResidencyGuard.figures``; its ``adapters``,
per name sent to vLLM, follow ``adapter=`` and are left out of ``view=alerts``),
``base_rows_guarded`` (``cpu_lora_ops``) and ``base_probe`` (``base_probe``).

Serving it must not stall the tokens the same event loop streams to clients: the loop only
copies the entries asked for (arrays and dicts, at C speed), letting other tasks run every
``YIELD_EVERY`` entries; rounding and ``json.dumps`` -- seconds at 200 adapters' samples --
run in a worker thread, an entry at a time (``render``: the GIL). ``document`` does the same synchronously, for tests.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from loragate_resolver import cpu_lora_ops, routing
from loragate_resolver.admin_guard import _error
from loragate_resolver.live_stats import VersionStats

YIELD_EVERY = 8  # entries copied between two turns of the other tasks on the loop
VIEWS = frozenset({"alerts"})
MAX_ADAPTERS = 4096  # names in one query: more is no watch's need


@dataclass(frozen=True)
class Query:
    adapters: frozenset[str] | None = None  # None: every adapter
    view: str | None = None  # "alerts": no versions

    def wants(self, adapter: object) -> bool:
        return self.adapters is None or adapter in self.adapters


class BadQuery(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def parse(query_string: bytes | str) -> Query:
    """The query of a figures request (module docstring); ``BadQuery`` says what is wrong."""
    try:
        raw = query_string.decode() if isinstance(query_string, bytes) else query_string
        pairs = parse_qsl(
            raw, keep_blank_values=True, strict_parsing=bool(raw), errors="strict", max_num_fields=MAX_ADAPTERS + 1
        )
    except (ValueError, UnicodeError) as e:
        raise BadQuery(f"the query is not one loragate can read ({e})") from None
    adapters: set[str] = set()
    views: list[str] = []
    for name, value in pairs:
        if name == "adapter":
            if not value:
                raise BadQuery("adapter names an adapter: it cannot be empty", "adapter")
            adapters.add(value)
        elif name == "view":
            if value not in VIEWS:
                raise BadQuery(f"view is one of {sorted(VIEWS)}, not {value!r}", "view")
            views.append(value)
        else:
            raise BadQuery(f"unknown query parameter {name!r}: the figures take adapter (repeatable) and view", name)
    if len(views) > 1:
        raise BadQuery("view is given once", "view")
    if len(adapters) > MAX_ADAPTERS:
        raise BadQuery(f"at most {MAX_ADAPTERS} adapters in one query", "adapter")
    return Query(frozenset(adapters) if adapters else None, views[0] if views else None)


@dataclass
class Snapshot:
    head: dict[str, Any]  # everything but the versions, already plain
    versions: list[tuple[VersionStats, str, int]]  # a copy of each entry, its breaker's state and trips


def _head(split: Any, query: Query, scope: dict | None) -> dict[str, Any]:
    server = (scope or {}).get("server")
    replica = split.replica or (f"{server[0]}:{server[1]}" if server else None)
    stats = split.stats
    return {
        "replica": replica,
        "role": split.role,
        "routes": {name: route.as_dict() for name, route in sorted(split.routes.items()) if query.wants(name)},
        "routes_read_at": split.read_at and split.read_at.isoformat(),
        "alerts": [a for a in list(stats.alerts) if query.wants(a.get("adapter"))],
        "fallback_15m": stats.fallback_rate(),
        "fallback_15m_by_adapter": stats.fallback_rates(query.adapters),
        "kept": {"entries": len(stats.versions), "ended_windows_dropped": stats.ended_windows_dropped},
        "residency": split.guard.figures(_residency_filter(query), per_adapter=query.view != "alerts"),
        "base_rows_guarded": cpu_lora_ops.base_rows_guarded(),
        "base_probe": split.base_probe.figures(),
    }


def _residency_filter(query: Query) -> Any:
    """The names sent to vLLM (plain or ``name@version``) of the adapters asked for."""
    if query.adapters is None:
        return None

    def wanted(lora_name: str) -> bool:
        qualified = routing.split_qualified(lora_name)
        return query.wants(qualified[0] if qualified else lora_name)

    return wanted


def _entries(split: Any, query: Query) -> Iterator[tuple[VersionStats, str, int]]:
    if query.view == "alerts":
        return
    limits = split.current_limits()
    # the keys copied first: entries counted or pruned meanwhile change no iteration
    for (adapter, version, _), stats in list(split.stats.versions.items()):
        if not query.wants(adapter):
            continue
        breaker = split.breakers.get((adapter, version))
        yield stats.copy(), breaker.state(limits) if breaker else "closed", breaker.trips if breaker else 0


async def snapshot(split: Any, query: Query, scope: dict | None = None) -> Snapshot:
    """On the event loop: the entries asked for, copied, other tasks running in between."""
    taken = Snapshot(_head(split, query, scope), [])
    for count, entry in enumerate(_entries(split, query), 1):
        taken.versions.append(entry)
        if count % YIELD_EVERY == 0:
            await asyncio.sleep(0)
    return taken


def snapshot_now(split: Any, query: Query, scope: dict | None = None) -> Snapshot:
    return Snapshot(_head(split, query, scope), list(_entries(split, query)))


def _version(stats: VersionStats, state: str, trips: int) -> dict[str, Any]:
    return {**stats.as_dict(), "breaker": state, "trips": trips}


def plain(taken: Snapshot) -> dict[str, Any]:
    """The document of a snapshot: rounding every sample, the costly part."""
    return {**taken.head, "versions": [_version(*entry) for entry in taken.versions]}


def render(taken: Snapshot) -> bytes:
    """The document as JSON, one entry at a time: ``json.dumps`` runs in C and keeps the GIL
    until it returns, so one call over every entry would stall the event loop's thread as
    long (seconds at 200 adapters) even from a worker thread; between two entries the loop
    gets its turn."""
    versions = ", ".join(json.dumps(_version(*entry)) for entry in taken.versions)
    head = json.dumps(taken.head)
    return f'{head[:-1]}, "versions": [{versions}]}}'.encode()


async def serve(split: Any, scope: dict) -> tuple[int, bytes]:
    """(status, body) of a figures request: rendered in a worker thread, off the loop."""
    try:
        query = parse(scope.get("query_string", b""))
    except BadQuery as e:
        return _error(400, "BadRequestError", str(e), e.param)
    taken = await snapshot(split, query, scope)
    return 200, await asyncio.to_thread(render, taken)


def document(split: Any, query_string: bytes | str = b"", scope: dict | None = None) -> dict[str, Any]:
    """The same document, synchronously, as a dict (tests, benches)."""
    return plain(snapshot_now(split, parse(query_string), scope))
