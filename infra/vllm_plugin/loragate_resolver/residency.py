"""A model of the engine's adapter cache, kept in the API server, that refuses a load which
would thrash it: hot adapters pinned, the rest loaded on demand with a minimum residency and
a cap on evictions.

vLLM's worker keeps at most ``--max-cpu-loras`` adapters registered, an LRU: a request for one
not registered reads it from disk (here: copies and re-hashes the bundle, ``verified_load``)
and evicts the least recently used. Under a spread of adapters wider than the cache every
request can be such a cold load. ``ResidencyGuard`` mirrors that LRU by the names requests
send to vLLM and answers, before a request goes out, whether it is a ``hit`` (resident), a
``cold`` load with room or with an evictable victim, or ``refused``: every unpinned resident
is protected (``min_residency``), the trailing 60 s already hold ``evictions_per_minute``
evictions or this tenant's share of them (``eviction_cap``), or every resident is pinned
(``pinned_full``).

Each tenant -- an adapter, its ``name@version`` copies counted to it -- has a share: of the
unpinned slots and of the minute's evictions, each divided equally among the tenants asked
for in the trailing minute. A resident is protected for ``min_residency_s`` after its load,
and for ``min_residency_s`` after its last use while its tenant holds no more than its share
of the slots; and a tenant's loads that evict are at most its share of the minute's cap (one
at least). So one tenant's burst (or a few adapters' flood) neither keeps every slot from
another tenant nor spends the whole cap before it. The victim is the least recently used
unprotected resident. The split answers a refused request from the next version or the base
(``engine_cache``). Pinned names are never victims; a pinned name counts against the
capacity only once admitted. The model is a prediction: it never sees requests that bypass
the split, so ``reconcile`` corrects it from the engine's own list. With no known capacity
it refuses nothing (it still counts hits and cold loads).

Settings come from the replica process's environment: ``LORAGATE_MIN_RESIDENCY_S`` (default
30) and ``LORAGATE_EVICTIONS_PER_MINUTE`` (default 5); an invalid value is logged and the
default used. Pure and clock-injectable: no vLLM, no I/O.
"""

from __future__ import annotations

import logging
import math
import os
import time
from array import array
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

MIN_RESIDENCY_VARIABLE = "LORAGATE_MIN_RESIDENCY_S"
EVICTIONS_VARIABLE = "LORAGATE_EVICTIONS_PER_MINUTE"
DEFAULT_MIN_RESIDENCY_S = 30.0
DEFAULT_EVICTIONS_PER_MINUTE = 5
EVICTION_WINDOW_S = 60.0
COLD_SAMPLES = 512
# an adapter with no request for this long drops out of the per-adapter counts (``prune``)
IDLE_S = 15 * 60.0
# per-adapter counts kept at most, the longest unseen dropped first: the figures stay bounded
# between two prunes whatever the spread of names (about 100 bytes of the document each)
COUNTED = 1024
# kept in the trailing window at most: enough to count far past any sane cap
_EVICTION_TIMES = 4096

HIT, COLD, REFUSED = "hit", "cold", "refused"
MIN_RESIDENCY, EVICTION_CAP, PINNED_FULL = "min_residency", "eviction_cap", "pinned_full"

log = logging.getLogger("loragate_resolver.residency")


@dataclass(frozen=True)
class Admission:
    kind: str  # hit, cold or refused
    evicted: str | None = None  # the resident a cold load pushes out
    reason: str | None = None  # why refused: min_residency, eviction_cap or pinned_full


@dataclass
class Counts:
    hits: int = 0
    misses: int = 0  # cold loads admitted
    refused: int = 0
    evictions: int = 0  # times this name was pushed out
    seen_at: float = 0.0

    def as_dict(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "refused": self.refused, "evictions": self.evictions}


class ResidencyGuard:
    """See the module docstring. ``capacity``: the engine's ``max_cpu_loras`` (None: unknown,
    nothing refused); it may be set later, once the engine's config is reachable."""

    def __init__(
        self,
        capacity: int | None,
        min_residency_s: float = DEFAULT_MIN_RESIDENCY_S,
        evictions_per_minute: int = DEFAULT_EVICTIONS_PER_MINUTE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity = capacity
        self.min_residency_s = min_residency_s
        self.evictions_per_minute = evictions_per_minute
        self.clock = clock
        # name -> its last use, least recent first; -inf: joined from the engine, use unknown
        self._resident: OrderedDict[str, float] = OrderedDict()
        self._loaded: dict[str, float] = {}  # name -> when its load was admitted
        self._pinned: frozenset[str] = frozenset()
        # (when, the tenant whose cold load evicted), oldest first
        self._evictions: deque[tuple[float, str]] = deque(maxlen=_EVICTION_TIMES)
        self._asked: OrderedDict[str, float] = OrderedDict()  # tenant -> last asked, oldest first
        self._counts: OrderedDict[str, Counts] = OrderedDict()
        self._totals = Counts()
        self._cold = array("d")  # seconds, a ring of the newest COLD_SAMPLES
        self._cold_next = 0

    # -- what a request asks -------------------------------------------------------------

    def admit(self, lora_name: str, refuse: bool = True) -> Admission:
        """Whether a request naming ``lora_name`` finds it resident, loads it, or is refused.
        ``refuse=False``: the request goes to vLLM whatever the answer (no later version to
        send it to), so the load is modelled as the engine makes it: the least recently used
        unpinned resident goes, however recent."""
        now = self.clock()
        counts = self._touch(lora_name, now)
        tenant = tenant_of(lora_name)
        self._asked[tenant] = now
        self._asked.move_to_end(tenant)
        while len(self._asked) > COUNTED:
            self._asked.popitem(last=False)
        if lora_name in self._resident:
            self._resident[lora_name] = now
            self._resident.move_to_end(lora_name)
            counts.hits += 1
            self._totals.hits += 1
            return Admission(HIT)
        evicted: str | None = None
        if self.capacity is not None and len(self._resident) >= self.capacity:
            evicted, reason = self._victim(tenant, now)
            if evicted is None and refuse:
                counts.refused += 1
                self._totals.refused += 1
                return Admission(REFUSED, reason=reason)
            if evicted is None:
                evicted = next((n for n in self._resident if n not in self._pinned), None)
            if evicted is not None:
                del self._resident[evicted]
                self._loaded.pop(evicted, None)
                self._evictions.append((now, tenant))
                self._touch(evicted, now).evictions += 1
                self._totals.evictions += 1
        self._resident[lora_name] = now
        self._loaded[lora_name] = now
        counts.misses += 1
        self._totals.misses += 1
        return Admission(COLD, evicted=evicted)

    def _victim(self, tenant: str, now: float) -> tuple[str | None, str | None]:
        """(the resident ``tenant``'s cold load may evict, None) or (None, why none may go)."""
        unpinned = [name for name in self._resident if name not in self._pinned]
        if not unpinned:
            return None, PINNED_FULL
        tenants = self._tenants_asked(now)
        slot_share = len(unpinned) / tenants
        held: dict[str, int] = {}
        for name in unpinned:
            held[tenant_of(name)] = held.get(tenant_of(name), 0) + 1

        def protected(name: str) -> bool:
            if now - self._loaded.get(name, -math.inf) < self.min_residency_s:
                return True
            return now - self._resident[name] < self.min_residency_s and held[tenant_of(name)] <= slot_share

        victim = next((n for n in unpinned if not protected(n)), None)
        if victim is None:
            return None, MIN_RESIDENCY
        if self.evictions_last_minute(now) >= self.evictions_per_minute:
            return None, EVICTION_CAP
        own = sum(1 for _, by in self._evictions if by == tenant)
        if own >= max(1.0, self.evictions_per_minute / tenants):
            return None, EVICTION_CAP
        return victim, None

    def _tenants_asked(self, now: float) -> int:
        """Tenants asked for in the trailing minute (at least the one asking now)."""
        while self._asked and now - next(iter(self._asked.values())) >= EVICTION_WINDOW_S:
            self._asked.popitem(last=False)
        return max(1, len(self._asked))

    def evictions_last_minute(self, now: float | None = None) -> int:
        now = self.clock() if now is None else now
        while self._evictions and now - self._evictions[0][0] >= EVICTION_WINDOW_S:
            self._evictions.popleft()
        return len(self._evictions)

    def record_cold_load(self, lora_name: str, seconds: float) -> None:
        """How long a cold load took (the attempt's time to its first body chunk)."""
        if not math.isfinite(seconds) or seconds < 0:
            return
        self._touch(lora_name, self.clock())
        if len(self._cold) < COLD_SAMPLES:
            self._cold.append(seconds)
        else:
            self._cold[self._cold_next] = seconds
        self._cold_next = (self._cold_next + 1) % COLD_SAMPLES

    # -- the engine's truth --------------------------------------------------------------

    def set_pinned(self, names: Iterable[str]) -> None:
        self._pinned = frozenset(names)

    def forget(self, names: Iterable[str]) -> None:
        """Names the engine does not hold after all (a load that failed): out, no eviction."""
        for name in names:
            self._resident.pop(name, None)
            self._loaded.pop(name, None)

    def reconcile(self, resident_names: Iterable[str], grace_s: float = 0.0) -> None:
        """Make the model hold what the engine holds: names it no longer holds drop out (but
        those used within ``grace_s``: admitted, their request not yet scheduled), names it
        holds that the model lacks join as the least recent."""
        now = self.clock()
        held = list(dict.fromkeys(resident_names))
        kept = set(held)
        for name in [n for n, used in self._resident.items() if n not in kept and now - used >= grace_s]:
            del self._resident[name]
            self._loaded.pop(name, None)
        joined = [(n, -math.inf) for n in held if n not in self._resident]
        self._resident = OrderedDict([*joined, *self._resident.items()])

    def resident(self) -> list[str]:
        """The names modelled resident, least recent first."""
        return list(self._resident)

    def pinned(self) -> frozenset[str]:
        return self._pinned

    # -- figures -------------------------------------------------------------------------

    def _touch(self, lora_name: str, now: float) -> Counts:
        counts = self._counts.get(lora_name)
        if counts is None:
            counts = self._counts[lora_name] = Counts()
            while len(self._counts) > COUNTED:
                self._counts.popitem(last=False)
        else:
            self._counts.move_to_end(lora_name)
        counts.seen_at = now
        return counts

    def prune(self) -> None:
        """Drop the counts of names unseen for ``IDLE_S``; with no known capacity, such names
        leave the model too (nothing else would bound it)."""
        now = self.clock()
        self._tenants_asked(now)
        for name in [n for n, c in self._counts.items() if now - c.seen_at >= IDLE_S]:
            del self._counts[name]
            if self.capacity is None:
                self._resident.pop(name, None)
                self._loaded.pop(name, None)

    def asked(self) -> int:
        """Requests the guard has been asked about since it started."""
        return self._totals.hits + self._totals.misses + self._totals.refused

    def figures(self, adapters: Callable[[str], bool] | None = None, per_adapter: bool = True) -> dict[str, Any]:
        """A JSON-able summary: settings, what is resident and pinned, the hit rate and the
        evictions of the last minute since start, cold loads' p50/p99, and per name (of those
        ``adapters`` keeps) its counts."""
        totals = self._totals
        asked = totals.hits + totals.misses + totals.refused
        cold = sorted(self._cold)
        document: dict[str, Any] = {
            "capacity": self.capacity,
            "min_residency_s": self.min_residency_s,
            "evictions_per_minute": self.evictions_per_minute,
            "resident": len(self._resident),
            "pinned": sorted(self._pinned),
            "hit_rate": round(totals.hits / asked, 4) if asked else None,
            "totals": totals.as_dict(),
            "evictions_last_minute": self.evictions_last_minute(),
            "cold_loads": len(cold),
            "cold_load_p50_ms": _quantile_ms(cold, 0.5),
            "cold_load_p99_ms": _quantile_ms(cold, 0.99),
        }
        if per_adapter:
            document["adapters"] = {
                name: counts.as_dict() for name, counts in self._counts.items() if adapters is None or adapters(name)
            }
        return document


def tenant_of(lora_name: str) -> str:
    """The adapter a name serves: a warm ``name@version`` copy counts to its adapter."""
    return lora_name.split("@", 1)[0]


def _quantile_ms(ordered: list[float], q: float) -> float | None:
    if not ordered:
        return None
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 3)


def settings(environ: Mapping[str, str] | None = None) -> tuple[float, int]:
    """(min residency in seconds, evictions per minute) from the replica's environment."""
    environ = os.environ if environ is None else environ
    min_residency = _setting(environ, MIN_RESIDENCY_VARIABLE, DEFAULT_MIN_RESIDENCY_S, float)
    evictions = _setting(environ, EVICTIONS_VARIABLE, DEFAULT_EVICTIONS_PER_MINUTE, int)
    return float(min_residency), int(evictions)


def _setting(environ: Mapping[str, str], name: str, default: float, kind: type) -> float:
    raw = environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = kind(raw.strip())
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value < 0:
        log.warning("loragate: %s=%r is not a number of 0 or more; using %s", name, raw, default)
        return default
    return value


def from_environment(
    capacity: int | None = None,
    environ: Mapping[str, str] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> ResidencyGuard:
    min_residency, evictions = settings(environ)
    return ResidencyGuard(capacity, min_residency, evictions, clock)
