"""Live figures per (adapter, version, window) from the replica's real requests, in memory.

Counters (requests, errors, fallbacks, accepted, retried) and a uniform sample of at most
``SAMPLES`` of the window's latencies, times to first token and milliseconds per token (a
``Reservoir``: both versions' samples span the whole window, production's thousands a
minute and the canary's few alike, in bounded memory), and the texts of the
last ``ANSWER_SAMPLES`` good non-streaming answers (every ``ANSWER_SAMPLE_EVERY``-th, each cut
to ``ANSWER_SAMPLE_CHARS``) for the format check against the golden set's schemas; streamed
answers are never sampled (the split does not keep their bodies). loragate reads them from
every replica (``GET /loragate/traffic``) and aggregates them when it judges a window; a
restarted replica starts from zero, which the reader sees as a smaller count, never as a
wrong one. Feedback is kept by its request id's nonce (``feedback``: nonce -> ``a``ccepted or
``r``etried, at most ``FEEDBACK_IDS`` per entry): an id is counted once here, and the reader
counts each nonce once across every replica, however many it was sent to. ``units``: per
window entry, a sample of its users -- a user's keyed hash -> (requests, errors), kept where
the hash has ``level`` leading zero bits, the level raised whenever more than ``UNITS`` are
kept -- the same users on every replica, so the reader merges them exactly and judges the
window by the unit the split randomises (loragate's ``rules/units.py``). Also: the
breaker trips (alerts) and a 15-minute ring of (time, adapter, fell back) for the replica's
fallback rate.
"""

from __future__ import annotations

import os
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

SAMPLES = 4096
FALLBACK_WINDOW_S = 15 * 60
# production needs this many per-token samples before "3x its p99" means anything
MIN_PRODUCTION_SAMPLES = 20
# answer texts kept per entry: enough for a format-compliance rate, bounded in memory
ANSWER_SAMPLES = 32
ANSWER_SAMPLE_CHARS = 2000
ANSWER_SAMPLE_EVERY = max(1, int(os.environ.get("LORAGATE_ANSWER_SAMPLE_EVERY", "1") or 1))
_RING_MAX = 1 << 20
FEEDBACK_IDS = 1 << 16  # per entry: beyond it, feedback is not counted (and says so)
_ALERTS_MAX = 1000
UNITS = 1024  # users kept per window entry: enough to estimate how their failures cluster
_HASH_BITS = 64

Key = tuple[str, str, int | None]


class Reservoir:
    """At most ``size`` of the values appended, each value seen so far kept with the same
    chance (Vitter's algorithm R): a uniform sample of the whole span, never only its end."""

    def __init__(self, size: int = SAMPLES, rng: random.Random | None = None) -> None:
        self.size, self.seen = size, 0
        self.values: list[float] = []
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
    latency_ms: Reservoir = field(default_factory=Reservoir)
    ttft_ms: Reservoir = field(default_factory=Reservoir)
    ms_per_token: Reservoir = field(default_factory=Reservoir)
    answers: deque = field(default_factory=lambda: deque(maxlen=ANSWER_SAMPLES))
    texts_seen: int = 0
    feedback: dict[str, str] = field(default_factory=dict)  # nonce -> "a" or "r"
    units: UnitSample = field(default_factory=UnitSample)

    def counted(self, unit: int | None, error: bool) -> None:
        """One request of the unit hashed to ``unit`` (None: outside a window, no sample)."""
        self.requests += 1
        self.errors += int(error)
        if unit is not None:
            self.units.add(unit, error)

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


class LiveStats:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.versions: dict[Key, VersionStats] = {}
        self.alerts: deque[dict[str, Any]] = deque(maxlen=_ALERTS_MAX)
        self.ring: deque[tuple[float, str, bool]] = deque(maxlen=_RING_MAX)
        # (adapter, version) -> (per-token samples seen when computed, p99)
        self._p99: dict[tuple[str, str], tuple[int, float | None]] = {}
        self._seen: dict[tuple[str, str], int] = {}

    def of(self, adapter: str, version: str, window: int | None) -> VersionStats:
        key = (adapter, version, window)
        stats = self.versions.get(key)
        if stats is None:
            stats = self.versions[key] = VersionStats(adapter, version, window)
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
                stats.answers.append(text[:ANSWER_SAMPLE_CHARS])
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

    def finished(self, adapter: str, fell_back: bool) -> None:
        now = self.clock()
        self.ring.append((now, adapter, fell_back))
        while self.ring and self.ring[0][0] < now - FALLBACK_WINDOW_S:
            self.ring.popleft()

    def fallback_rate(self) -> dict[str, int]:
        since = self.clock() - FALLBACK_WINDOW_S
        recent = [fell for at, _, fell in self.ring if at >= since]
        return {"requests": len(recent), "fallbacks": sum(recent)}

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
            "at": datetime.fromtimestamp(self.clock(), UTC).isoformat(),
            "kind": kind,
            "adapter": adapter,
            "version": version,
            "window": window,
            "reason": reason,
        }
        self.alerts.append(entry)
        return entry
