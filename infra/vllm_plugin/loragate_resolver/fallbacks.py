"""Each adapter's requests and fallbacks over the last 15 minutes, in one-minute buckets.

A bucket per adapter and minute of the clock (requests, fallbacks); at most ``BUCKETS`` per
adapter, the current minute and the 14 before it, so the rate covers between 14 and 15
minutes; an adapter with no request in that time is dropped (``drop_idle``). Bounded by the
adapters of the last 15 minutes, whatever the request rate -- a ring of every request once
held up to a million entries. The fleet's watch reads the rate per adapter, and the replica's
sum (``traffic_watch`` in loragate).
"""

from __future__ import annotations

from collections import deque

FALLBACK_WINDOW_S = 15 * 60
BUCKET_S = 60
BUCKETS = FALLBACK_WINDOW_S // BUCKET_S


class FallbackMinutes:
    def __init__(self) -> None:
        # adapter -> [minute, requests, fallbacks], oldest first
        self.buckets: dict[str, deque[list[int]]] = {}

    def add(self, adapter: str, fell_back: bool, now: float) -> None:
        minute = int(now // BUCKET_S)
        buckets = self.buckets.get(adapter)
        if buckets is None:
            buckets = self.buckets[adapter] = deque(maxlen=BUCKETS)
        # a clock set back counts in the newest bucket: never one out of order
        if buckets and buckets[-1][0] >= minute:
            buckets[-1][1] += 1
            buckets[-1][2] += int(fell_back)
        else:
            buckets.append([minute, 1, int(fell_back)])

    def by_adapter(self, now: float, adapters: frozenset[str] | None = None) -> dict[str, dict[str, int]]:
        """{adapter: {"requests", "fallbacks"}} over the last 15 minutes, of ``adapters``
        (None: every adapter with a request in that time)."""
        oldest = int(now // BUCKET_S) - BUCKETS + 1
        rates = {}
        for adapter, buckets in list(self.buckets.items()):
            if adapters is not None and adapter not in adapters:
                continue
            recent = [b for b in list(buckets) if b[0] >= oldest]
            if recent:
                rates[adapter] = {"requests": sum(b[1] for b in recent), "fallbacks": sum(b[2] for b in recent)}
        return rates

    def total(self, now: float) -> dict[str, int]:
        rates = self.by_adapter(now).values()
        return {"requests": sum(r["requests"] for r in rates), "fallbacks": sum(r["fallbacks"] for r in rates)}

    def drop_idle(self, now: float) -> None:
        oldest = int(now // BUCKET_S) - BUCKETS + 1
        for adapter in [a for a, b in self.buckets.items() if not b or b[-1][0] < oldest]:
            del self.buckets[adapter]
