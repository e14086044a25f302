"""Each adapter's requests and fallbacks over the last 15 minutes, in one-minute buckets.

A bucket per adapter and minute of the clock (requests, fallbacks); at most ``BUCKETS`` per
adapter, the current minute and the 14 before it, so the rate covers between 14 and 15
minutes; an adapter with no request in that time is dropped (``drop_idle``). Bounded by the
adapters of the last 15 minutes, whatever the request rate -- a ring of every request once
held up to a million entries. The fleet's watch reads the rate per adapter, and the replica's
sum (``traffic_watch`` in loragate).

Beside them, what the fleet pins by (``PinningDemand``): an adapter's *answered* requests
over the same 15 minutes, at most ``USER_CAP`` of each user's -- so neither requests every
version refused nor one caller's flood buys a hot slot over another tenant's real users.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque

FALLBACK_WINDOW_S = 15 * 60
BUCKET_S = 60
BUCKETS = FALLBACK_WINDOW_S // BUCKET_S
# a user's answered requests that count toward its adapter's pinning within the 15 minutes
USER_CAP = 5
# users remembered per adapter, the least recently seen forgotten first: bounded memory
USERS_KEPT = 4096


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
        (None: every adapter with a request in that time); ``pinning`` is added by
        ``live_stats``."""
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


class PinningDemand:
    """Per adapter, each user's newest ``USER_CAP`` answered requests (their times), users
    by a short digest of their name, least recently seen first."""

    def __init__(self) -> None:
        self.users: dict[str, OrderedDict[bytes, deque[float]]] = {}

    def add(self, adapter: str, user: str, now: float) -> None:
        users = self.users.get(adapter)
        if users is None:
            users = self.users[adapter] = OrderedDict()
        key = hashlib.blake2b(user.encode("utf-8", "replace"), digest_size=8).digest()
        times = users.get(key)
        if times is None:
            times = users[key] = deque(maxlen=USER_CAP)
            while len(users) > USERS_KEPT:
                users.popitem(last=False)
        else:
            users.move_to_end(key)
        times.append(now)

    def of(self, adapter: str, now: float) -> int:
        """The adapter's answered requests in the last 15 minutes, at most ``USER_CAP`` a user."""
        users = self.users.get(adapter)
        if not users:
            return 0
        oldest = now - FALLBACK_WINDOW_S
        while users and next(iter(users.values()))[-1] < oldest:
            users.popitem(last=False)
        return sum(1 for times in users.values() for at in times if at >= oldest)

    def drop_idle(self, now: float) -> None:
        for adapter in [a for a in self.users if not self.of(a, now)]:
            del self.users[adapter]
