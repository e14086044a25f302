"""Live figures per (adapter, version, window) from the replica's real requests, in memory.

Counters (requests, errors, fallbacks, accepted, retried) and a uniform sample of at most
``SAMPLES`` of the window's latencies, times to first token and milliseconds per token (a
``Reservoir`` of C doubles: both versions' samples span the whole window, production's
thousands a minute and the canary's few alike, in bounded memory; ``OUTSIDE_SAMPLES`` for an
entry outside a window, which only the breaker's production p99 reads), and a uniform sample of
``ANSWER_SAMPLES`` texts of the good non-streaming answers over the window (of every
``ANSWER_SAMPLE_EVERY``-th, each cut to ``ANSWER_SAMPLE_CHARS``) for the format check against
the golden set's schemas; streamed answers are never sampled (the split does not keep their
bodies). loragate reads them from every replica (``GET /loragate/traffic``: ``figures``) and
aggregates them when it judges a window; a restarted replica starts from zero, which the reader
sees as a smaller count, never as a wrong one. Feedback is kept by its request id's nonce
(``feedback``: nonce -> ``a``ccepted or ``r``etried, at most ``FEEDBACK_IDS`` per entry): an id
is counted once here, and the reader counts each nonce once across every replica, however many
it was sent to. ``units``: per window entry, a sample of its users -- a user's keyed hash ->
(requests, errors), kept where the hash has ``level`` leading zero bits, the level raised
whenever more than ``UNITS`` are kept -- the same users on every replica, so the reader merges
them exactly and judges the window by the unit the split randomises (loragate's
``rules/units.py``).

What is kept, and for how long (``prune``, on each read of the routing table): the entries of
every route's active window and of every routed (adapter, version) outside a window; an entry
of an ended window, or of a version no route names any more, until it has had no request for
``ENDED_WINDOW_KEEP_S`` (the evaluation that ends a window reads it just before) -- and never
more than ``ENDED_WINDOWS_KEPT`` ended-window entries, the longest idle dropped first. Also:
the breaker trips (``alerts``, the newest ``ALERTS_KEPT``, each with an ``id`` unique across
the process's restarts: a boot nonce and a sequence number) and, per adapter, its requests and
fallbacks in one-minute buckets over the last ``FALLBACK_WINDOW_S`` (``fallbacks``).
"""

from __future__ import annotations

import copy
import itertools
import os
import random
import secrets
import time
from array import array
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from loragate_resolver.fallbacks import FALLBACK_WINDOW_S, FallbackMinutes, PinningDemand

__all__ = ["FALLBACK_WINDOW_S", "LiveStats", "Reservoir", "UnitSample", "VersionStats"]

SAMPLES = 4096
# outside a window only the slow breaker's production p99 reads them: a few hundred do
OUTSIDE_SAMPLES = 512
# an ended window's entries outlive their last request this long: the evaluation that ends
# a window reads it just before, and a late one still finds it
ENDED_WINDOW_KEEP_S = 15 * 60
ENDED_WINDOWS_KEPT = 64  # ended-window entries, however recent: the table stays bounded
# production needs this many per-token samples before "3x its p99" means anything
MIN_PRODUCTION_SAMPLES = 20
# answer texts kept per entry: enough for a format-compliance rate, bounded in memory
ANSWER_SAMPLES = 32
ANSWER_SAMPLE_CHARS = 2000
ANSWER_SAMPLE_EVERY = max(1, int(os.environ.get("LORAGATE_ANSWER_SAMPLE_EVERY", "1") or 1))
FEEDBACK_IDS = 1 << 16  # per entry: beyond it, feedback is not counted (and says so)
ALERTS_KEPT = 1000
UNITS = 1024  # users kept per window entry: enough to estimate how their failures cluster
_HASH_BITS = 64

Key = tuple[str, str, int | None]
_ANSWER_RNG = random.SystemRandom()  # a client who knows the sequence could time its answers


class Reservoir:
    """At most ``size`` of the values appended, each value seen so far kept with the same
    chance (Vitter's algorithm R): a uniform sample of the whole span, never only its end."""

    def __init__(self, size: int = SAMPLES, rng: random.Random | None = None) -> None:
        self.size, self.seen = size, 0
        self.values = array("d")  # C doubles: 8 bytes a value, copied at C speed
        self._rng = rng or random.Random()

    def append(self, value: float) -> None:
        self.seen += 1
        if len(self.values) < self.size:
            self.values.append(value)
            return
        slot = self._rng.randrange(self.seen)
        if slot < self.size:
            self.values[slot] = value

    def __iter__(self) -> Any:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: int) -> float:
        return self.values[index]

    def copy(self) -> Reservoir:
        """The values so far, for a reader (no sampling state: nothing is appended to it)."""
        taken = Reservoir.__new__(Reservoir)
        taken.size, taken.seen, taken.values = self.size, self.seen, self.values[:]
        return taken


class UnitSample:
    """The users of one window entry whose hash has ``level`` leading zero bits, each with
    its requests and errors; at most ``UNITS`` of them (a full sample raises the level and
    drops the users no longer in it: a uniform sample, bounded, the same on every replica)."""

    def __init__(self) -> None:
        self.level = 0
        self.counts: dict[int, list[int]] = {}

    def _kept(self, unit: int) -> bool:
        return self.level == 0 or unit >> (_HASH_BITS - self.level) == 0

    def add(self, unit: int, error: bool) -> None:
        if not self._kept(unit):
            return
        counts = self.counts.setdefault(unit, [0, 0])
        counts[0] += 1
        counts[1] += int(error)
        while len(self.counts) > UNITS and self.level < _HASH_BITS:
            self.level += 1
            self.counts = {k: v for k, v in self.counts.items() if self._kept(k)}

    def copy(self) -> UnitSample:
        taken = UnitSample()
        taken.level, taken.counts = self.level, {k: list(v) for k, v in self.counts.items()}
        return taken

    def as_dict(self) -> dict[str, Any]:
        return {"level": self.level, "counts": {f"{k:016x}": list(v) for k, v in self.counts.items()}}


@dataclass
class VersionStats:
    adapter: str
    version: str
    window: int | None
    requests: int = 0
    errors: int = 0
    fallbacks: int = 0
    accepted: int = 0
    retried: int = 0
    latency_ms: Reservoir = field(init=False)
    ttft_ms: Reservoir = field(init=False)
    ms_per_token: Reservoir = field(init=False)
    answers: list = field(default_factory=list)  # a uniform sample of the texts offered
    texts_seen: int = 0
    texts_offered: int = 0
    feedback: dict[str, str] = field(default_factory=dict)  # nonce -> "a" or "r"
    units: UnitSample = field(default_factory=UnitSample)
    last_at: float = 0.0  # monotonic: the entry's last request, which ``prune`` goes by

    def __post_init__(self) -> None:
        size = SAMPLES if self.window is not None else OUTSIDE_SAMPLES
        self.latency_ms, self.ttft_ms, self.ms_per_token = Reservoir(size), Reservoir(size), Reservoir(size)

    def counted(self, unit: int | None, error: bool) -> None:
        """One request of the unit hashed to ``unit`` (None: outside a window, no sample)."""
        self.requests += 1
        self.errors += int(error)
        if unit is not None:
            self.units.add(unit, error)

    def keep_answer(self, text: str) -> None:
        """Algorithm R over the texts offered: every one kept with the same chance, so the
        format check reads the whole window, not the latest answers a client chose."""
        self.texts_offered += 1
        if len(self.answers) < ANSWER_SAMPLES:
            self.answers.append(text)
            return
        slot = _ANSWER_RNG.randrange(self.texts_offered)
        if slot < ANSWER_SAMPLES:
            self.answers[slot] = text

    def as_dict(self) -> dict[str, Any]:
        return {
            "adapter": self.adapter,
            "version": self.version,
            "window": self.window,
            "requests": self.requests,
            "errors": self.errors,
            "fallbacks": self.fallbacks,
            "accepted": self.accepted,
            "retried": self.retried,
            "latency_ms": [round(x, 3) for x in self.latency_ms],
            "ttft_ms": [round(x, 3) for x in self.ttft_ms],
            "ms_per_token": [round(x, 4) for x in self.ms_per_token],
            "samples": list(self.answers),
            "feedback": dict(self.feedback),
            **({"units": self.units.as_dict()} if self.window is not None else {}),
        }

    def copy(self) -> VersionStats:
        """The entry as it is now, for rendering off the event loop while this one keeps
        counting: every container copied (the samples at C speed)."""
        taken = copy.copy(self)
        taken.latency_ms, taken.ttft_ms = self.latency_ms.copy(), self.ttft_ms.copy()
        taken.ms_per_token = self.ms_per_token.copy()
        taken.answers, taken.feedback = list(self.answers), dict(self.feedback)
        taken.units = self.units.copy() if self.window is not None else self.units
        return taken


class LiveStats:
    """``clock``: wall time (alerts, the fallback buckets); ``monotonic``: how long an entry
    has been idle (``prune``)."""

    def __init__(self, clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.clock, self.monotonic = clock, monotonic
        self.versions: dict[Key, VersionStats] = {}
        self.alerts: deque[dict[str, Any]] = deque(maxlen=ALERTS_KEPT)
        self.fallbacks = FallbackMinutes()
        self.pinning = PinningDemand()
        self.ended_windows_dropped = 0
        # a restarted replica's ids never repeat an earlier process's: the fleet announces a trip once
        self._boot = secrets.token_hex(6)
        self._alert_seq = itertools.count(1)
        # (adapter, version) -> (per-token samples seen when computed, p99)
        self._p99: dict[tuple[str, str], tuple[int, float | None]] = {}
        self._seen: dict[tuple[str, str], int] = {}

    def of(self, adapter: str, version: str, window: int | None) -> VersionStats:
        key = (adapter, version, window)
        stats = self.versions.get(key)
        if stats is None:
            stats = self.versions[key] = VersionStats(adapter, version, window)
        stats.last_at = self.monotonic()
        return stats

    def answered(
        self,
        adapter: str,
        version: str,
        window: int | None,
        *,
        error: bool,
        latency_ms: float,
        ttft_ms: float | None,
        ms_per_token: float | None,
        text: str | None = None,
        unit: int | None = None,
    ) -> float | None:
        """One answer the client got from ``version``; its decode ms per token as given (None
        when unknown, ``traffic_flow.Attempt.ms_per_token``). ``text``: the answer's text
        where the split kept it (good, non-streaming answers); ``unit``: its user's hash
        (``routing.unit``)."""
        stats = self.of(adapter, version, window)
        stats.counted(unit, error)
        if error:
            return None
        if text is not None:
            stats.texts_seen += 1
            if stats.texts_seen % ANSWER_SAMPLE_EVERY == 0:
                stats.keep_answer(text[:ANSWER_SAMPLE_CHARS])
        stats.latency_ms.append(latency_ms)
        if ttft_ms is not None:
            stats.ttft_ms.append(ttft_ms)
        if ms_per_token is None:
            return None
        stats.ms_per_token.append(ms_per_token)
        self._seen[(adapter, version)] = self._seen.get((adapter, version), 0) + 1
        return ms_per_token

    def failed(
        self, adapter: str, version: str, window: int | None, *, error: bool = True, unit: int | None = None
    ) -> None:
        """A request ``version`` did not answer: the failure that made it fall back."""
        stats = self.of(adapter, version, window)
        stats.counted(unit, error)
        stats.fallbacks += 1

    def skipped(self, adapter: str, version: str, window: int | None) -> None:
        """A request the breaker kept from ``version``: a fallback, not a request of its own."""
        self.of(adapter, version, window).fallbacks += 1

    def finished(self, adapter: str, fell_back: bool, user: str | None = None, answered: bool = False) -> None:
        """A request the split is done with; ``answered`` (by any version or the base) by
        ``user``: it counts toward the adapter's pinning demand."""
        now = self.clock()
        self.fallbacks.add(adapter, fell_back, now)
        if answered and user is not None:
            self.pinning.add(adapter, user, now)

    def fallback_rate(self) -> dict[str, int]:
        """The replica's requests and fallbacks over the last 15 minutes, every adapter's."""
        return self.fallbacks.total(self.clock())

    def fallback_rates(self, adapters: frozenset[str] | None = None) -> dict[str, dict[str, int]]:
        """The same per adapter (of ``adapters``; None: every one), with its ``pinning``
        demand (``fallbacks.PinningDemand``)."""
        now = self.clock()
        rates = self.fallbacks.by_adapter(now, adapters)
        for adapter, rate in rates.items():
            rate["pinning"] = self.pinning.of(adapter, now)
        return rates

    def production_p99(self, adapter: str, version: str) -> float | None:
        """p99 ms per token of ``version`` over every window, once it has enough samples;
        recomputed every 64 new samples (a sort of 4096 per request would cost)."""
        key = (adapter, version)
        seen = self._seen.get(key, 0)
        cached = self._p99.get(key)
        if cached is not None and seen - cached[0] < 64:
            return cached[1]
        samples = sorted(x for (a, v, _), s in self.versions.items() if (a, v) == key for x in s.ms_per_token)
        value = None
        if len(samples) >= MIN_PRODUCTION_SAMPLES:
            value = samples[min(len(samples) - 1, int(0.99 * len(samples)))]
        self._p99[key] = (seen, value)
        return value

    def feedback(self, adapter: str, version: str, window: int | None, outcome: str, nonce: str) -> bool:
        """Count a tenant's feedback once per request id (its nonce); False when the id was
        counted before or the entry holds ``FEEDBACK_IDS`` already."""
        stats = self.of(adapter, version, window)
        if nonce in stats.feedback or len(stats.feedback) >= FEEDBACK_IDS:
            return False
        stats.feedback[nonce] = "a" if outcome == "accepted" else "r"
        if outcome == "accepted":
            stats.accepted += 1
        else:
            stats.retried += 1
        return True

    def alert(self, kind: str, adapter: str, version: str, window: int | None, reason: str) -> dict[str, Any]:
        entry = {
            "id": f"{self._boot}-{next(self._alert_seq)}",
            "at": datetime.fromtimestamp(self.clock(), UTC).isoformat(),
            "kind": kind,
            "adapter": adapter,
            "version": version,
            "window": window,
            "reason": reason,
        }
        self.alerts.append(entry)
        return entry

    def prune(self, routes: Mapping[str, Any]) -> None:
        """Drop what no reader needs any more (module docstring), given the routing table
        (adapter -> ``routing.Route``). One pass over the keys: cheap for thousands."""
        now = self.monotonic()
        active = {(name, r.window) for name, r in routes.items() if r.window is not None}
        routed = {(name, v) for name, r in routes.items() for v in (r.production, r.canary) if v}
        ended: list[tuple[float, Key]] = []
        for key, stats in list(self.versions.items()):
            adapter, version, window = key
            if window is None:
                if (adapter, version) not in routed and now - stats.last_at >= ENDED_WINDOW_KEEP_S:
                    del self.versions[key]
            elif (adapter, window) not in active:
                if now - stats.last_at >= ENDED_WINDOW_KEEP_S:
                    del self.versions[key]
                    self.ended_windows_dropped += 1
                else:
                    ended.append((stats.last_at, key))
        if len(ended) > ENDED_WINDOWS_KEPT:
            ended.sort()
            for _, key in ended[: len(ended) - ENDED_WINDOWS_KEPT]:
                del self.versions[key]
                self.ended_windows_dropped += 1
        pairs = self.pairs()
        for cache in (self._p99, self._seen):
            for pair in [p for p in cache if p not in pairs]:
                del cache[pair]
        self.fallbacks.drop_idle(self.clock())
        self.pinning.drop_idle(self.clock())

    def pairs(self) -> set[tuple[str, str]]:
        """The (adapter, version) pairs with an entry."""
        return {(adapter, version) for adapter, version, _ in self.versions}
