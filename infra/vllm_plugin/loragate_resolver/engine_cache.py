"""The engine's adapter cache from the API server's side: the residency guard asked before each
attempt of the live split, the engine's own list read back, the hot adapters pinned.

Guarded: a request through the split (``traffic``: a client's completion naming an adapter
of the routing table), for each version it asks, under the name it sends vLLM (plain or
``name@version``). A refused version is skipped like one whose breaker is open -- the next
version or the base model answers, with ``x-loragate-fallback: <kind>_residency:<reason>``
(``residency``: ``min_residency``, ``eviction_cap``, ``pinned_full``) -- counted as the
adapter's fallback and charged to no version. The last version of a chain (no base model
configured; a canary replica's one version) is never refused, only counted. A cold attempt's
time to its first body chunk is its cold load (for an answer that does not stream, the whole
answer's time). Not guarded: the fleet's own requests, models outside the table and every
other route; the adapters they load reach the guard only through ``tend``.

``tend``, after a read of the routes when ``due`` (``TEND_EVERY_S``, and only after requests or
a change of pins) and bounded by ``DEADLINE_S`` in all, reads the ids
the engine holds (``engine_client.list_loras``), names them through the serving layer's
table (``openai_serving_models.lora_requests``: name -> ``LoRARequest``) and corrects the
guard. A production replica then pins each pinned adapter's (``registry_reader``:
``adapter_pins``) production served name: ``engine_client.pin_lora(lora_int_id)`` once per
(name, id), once the engine holds it; a failure is logged and tried again at the next read,
never fatal. This process pins at most ``capacity - 1`` ids: vLLM raises in the engine's step
when every registered adapter is pinned. vLLM has no unpin: a name unpinned in the registry
leaves the guard's pinned set at once, but the engine keeps its pin (counted against the
``capacity - 1``) until the adapter is removed or the replica restarts. An id pinned for a
name the serving layer no longer maps to it (a switch loads a name afresh under a new id; an
unload never frees the engine's slot, vLLM #54839) is removed from the engine after
``STALE_PIN_S``, or it would hold its slot for good. Pins go to the CPU cache only
(``loragate_resolver.pin_in_the_cpu_cache_only``); where that patch is not in place nothing
is pinned. One guard per API-server process: with several API servers each models the
shared engine from its own requests.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import loragate_resolver
from loragate_resolver import metrics, routing
from loragate_resolver.residency import COLD, Admission

DEADLINE_S = 10.0
# the engine is asked at most this often, and only when the guard was asked about a request or
# the pins changed since: every call wakes vLLM's worker, which then spins on its message queue
# for a second -- asked at each routes read (1 s), an idle replica's worker burned half a core
TEND_EVERY_S = 15.0
STALE_PIN_S = 60.0
# a name admitted this recently stays in the model though the engine does not list it yet:
# vLLM registers a request's adapter when it schedules it, not when the split sends it
RECONCILE_GRACE_S = 10.0

log = logging.getLogger("loragate_resolver.engine_cache")


def adopt(split: Any, app: Any) -> None:
    """Keep the vLLM app's state (the engine client, the serving layer's table) for ``tend``,
    and give the guard the engine's capacity."""
    state = getattr(app, "state", None)
    if state is None:
        return
    split.app_state = state
    split.guard.capacity = capacity(state)


def capacity(state: Any) -> int | None:
    """The engine's adapter cache size: ``max_cpu_loras``, else ``max_loras``; None when LoRA
    is off or the config is not there."""
    lora = getattr(getattr(state, "vllm_config", None), "lora_config", None)
    for value in (getattr(lora, "max_cpu_loras", None), getattr(lora, "max_loras", None)):
        if isinstance(value, int) and value > 0:
            return value
    return None


def lora_requests(state: Any) -> Mapping[str, Any]:
    found = getattr(getattr(state, "openai_serving_models", None), "lora_requests", None)
    return found if isinstance(found, dict) else {}


def _adapter(lora_name: str) -> str:
    qualified = routing.split_qualified(lora_name)
    return qualified[0] if qualified else lora_name


def admit(split: Any, adapter: str, served: str, last: bool) -> Admission:
    """The guard's answer for one attempt of ``adapter`` under ``served``; never refused when
    it is the chain's ``last``."""
    admission: Admission = split.guard.admit(served, refuse=not last)
    metrics.lora_cache(adapter, admission.kind)
    if admission.evicted is not None:
        metrics.lora_eviction(_adapter(admission.evicted))
    return admission


def attempted(split: Any, adapter: str, served: str, admission: Admission, attempt: Any) -> None:
    """What the attempt tells the guard: a 404 is a name the engine does not hold; a cold
    attempt answered gives a cold load. Labels the attempt warm or cold for its first token."""
    if attempt.status == 404:
        split.guard.forget([served])
        return
    attempt.residency = "cold" if admission.kind == COLD else "warm"
    if admission.kind == COLD and attempt.status < 400 and attempt.first_chunk_at is not None:
        seconds = attempt.first_chunk_at - attempt.began
        split.guard.record_cold_load(served, seconds)
        metrics.lora_cold_load(adapter, seconds)


def served_pins(split: Any, loaded: Mapping[str, Any]) -> list[str]:
    """The names the pinned adapters' production versions are served under here, in the
    registry's order; adapters with no production route are left out."""
    names = []
    for adapter in split.pins:
        route = split.routes.get(adapter)
        if route is None or route.production is None:
            continue
        names.append(routing.served_name(adapter, route.production, split.index.version(adapter), loaded.keys()))
    return list(dict.fromkeys(names))


class EngineCache:
    """The pins this API-server process made: id -> the name it was pinned for."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.ids: dict[int, str] = {}
        self.stale_since: dict[int, float] = {}
        self._told: set[tuple[str, Any]] = set()  # problems logged once, not every second
        self._tended_at: float | None = None
        self._tended_for: tuple[int, tuple[str, ...]] | None = None  # (requests asked, pins)

    def due(self, split: Any) -> bool:
        """Whether to ask the engine now (``TEND_EVERY_S``)."""
        now = self.clock()
        if self._tended_at is not None and now - self._tended_at < TEND_EVERY_S:
            return False
        return (split.guard.asked(), tuple(split.pins)) != self._tended_for

    def _tell(self, key: tuple[str, Any], message: str, *args: Any) -> None:
        if key not in self._told:
            if len(self._told) >= 1024:
                self._told.clear()
            self._told.add(key)
            log.warning(message, *args)

    async def tend(self, split: Any) -> None:
        """Correct the guard from the engine and pin (module docstring), when ``due``; never raises."""
        if not self.due(split):
            return
        self._tended_at, self._tended_for = self.clock(), (split.guard.asked(), tuple(split.pins))
        try:
            await asyncio.wait_for(self._tend(split), DEADLINE_S)
        except TimeoutError:
            log.warning("loragate: the engine's adapter cache not tended within %ss; again next read", DEADLINE_S)
        except Exception:  # never let the routes' loop die of it
            log.exception("loragate: tending the engine's adapter cache failed; again next read")

    async def _tend(self, split: Any) -> None:
        state = getattr(split, "app_state", None)
        engine = getattr(state, "engine_client", None)
        guard = split.guard
        if engine is None or guard.capacity is None:
            return
        held = set(await engine.list_loras())
        loaded = dict(lora_requests(state))
        ids = {name: r.lora_int_id for name, r in loaded.items() if isinstance(getattr(r, "lora_int_id", None), int)}
        guard.reconcile([name for name, i in ids.items() if i in held], RECONCILE_GRACE_S)
        if split.role != "production":
            guard.set_pinned(())
        elif not loragate_resolver.pins_off_the_gpu():
            guard.set_pinned(())
            if split.pins:
                self._tell(("gpu", None), "loragate: vLLM's pins are not kept to the CPU cache here: nothing pinned")
        else:
            await self._pin(split, engine, ids, held)
        metrics.lora_cache_size(len(guard.resident()), len(self.ids))

    async def _pin(self, split: Any, engine: Any, ids: dict[str, int], held: set[int]) -> None:
        for gone in [i for i in self.ids if i not in held]:  # removed: its pin went with it
            del self.ids[gone]
        await self._release_stale(engine, ids)
        wanted = served_pins(split, ids)
        lingering = [i for i, name in self.ids.items() if name not in wanted or ids.get(name) != i]
        room = max(0, split.guard.capacity - 1 - len(lingering))
        # the names pinned already stay first: the engine holds their pins whatever the order
        kept = [name for name in wanted if self.ids.get(ids.get(name, 0)) == name]
        allowed = kept + [name for name in wanted if name not in kept][: max(0, room - len(kept))]
        if len(allowed) < len(wanted):
            left_out = [name for name in wanted if name not in allowed]
            self._tell(
                ("room", tuple(left_out)),
                "loragate: %d adapter(s) pinned in the registry, room for %d here (max_cpu_loras - 1, "
                "less %d pin(s) kept since); not pinned: %s",
                len(wanted),
                room,
                len(lingering),
                ", ".join(left_out),
            )
        split.guard.set_pinned(allowed)
        for name in allowed:
            lora_id = ids.get(name)
            if lora_id is None or lora_id not in held or self.ids.get(lora_id) == name:
                continue  # not loaded yet (the next read pins it), or pinned already
            try:
                pinned = await engine.pin_lora(lora_id)
            except Exception as e:  # e.g. evicted since it was listed: the next read tries again
                self._tell(("pin", (name, lora_id)), "loragate: pinning %s (id %d) failed: %s", name, lora_id, e)
                continue
            if pinned is False:
                self._tell(("pin", (name, lora_id)), "loragate: the engine did not pin %s (id %d)", name, lora_id)
                continue
            self.ids[lora_id] = name
            log.info("loragate: %s (id %d) pinned in the engine's adapter cache", name, lora_id)

    async def _release_stale(self, engine: Any, ids: dict[str, int]) -> None:
        now = self.clock()
        stale = {i for i, name in self.ids.items() if ids.get(name) != i}
        for lora_id in [i for i in self.stale_since if i not in stale]:
            del self.stale_since[lora_id]
        for lora_id in sorted(stale):
            since = self.stale_since.setdefault(lora_id, now)
            if now - since < STALE_PIN_S:
                continue
            try:
                await engine.remove_lora(lora_id)
            except Exception as e:
                self._tell(("release", lora_id), "loragate: removing stale pinned id %d failed: %s", lora_id, e)
                continue
            log.info("loragate: stale pinned id %d (was %s) removed from the engine", lora_id, self.ids[lora_id])
            del self.ids[lora_id]
            del self.stale_since[lora_id]
