"""The residency benchmark's workload: a Zipf spread of users' requests over the active
adapters of one production replica, sent one at a time through the live split as a client
would, each answer's time to first token taken from the stream, and whether the replica
loaded it cold read from the replica's own residency figures after each answer
(``GET /loragate/traffic?adapter=NAME``, the fleet's key): the guard's count of cold loads
for that adapter is what moved.

The Zipf exponent is chosen so that the top 10 of the active adapters carry the share the
seeds name (about 60 % of 200 at 1.15).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

VERSION_HEADER = "x-loragate-version"
FALLBACK_HEADER = "x-loragate-fallback"
ADMIN_HEADER = "x-loragate-admin-key"
ZIPF_EXPONENT = 1.15
REQUEST_TIMEOUT_S = 120.0


def zipf_weights(n: int, exponent: float = ZIPF_EXPONENT) -> list[float]:
    raw = [1 / (rank**exponent) for rank in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def top_share(weights: list[float], top: int) -> float:
    return sum(sorted(weights, reverse=True)[:top])


def schedule(names: list[str], requests: int, seed: int) -> list[str]:
    """The adapters asked, in order: ``names`` ranked hottest first, drawn by Zipf weight."""
    rng = random.Random(seed)
    return rng.choices(names, weights=zipf_weights(len(names)), k=requests)


@dataclass
class Answer:
    adapter: str
    ttft_s: float | None
    status: int
    version: str | None
    fallback: str | None
    cold: bool | None  # None: the replica's figures did not say


@dataclass
class Workload:
    answers: list[Answer] = field(default_factory=list)
    seconds: float = 0.0


def _cold_loads(admin: httpx.Client, adapter: str) -> int | None:
    document = admin.get("/loragate/traffic", params={"adapter": adapter}).json()
    residency = document.get("residency") or {}
    counts = (residency.get("adapters") or {}).get(adapter)
    return counts.get("misses") if isinstance(counts, dict) else None


def run(url: str, admin_key: str, order: list[str], users: int = 50) -> Workload:
    """Every request of ``order`` through the split, streamed, one at a time."""
    workload = Workload()
    started = time.monotonic()
    with (
        httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S) as client,
        httpx.Client(base_url=url, timeout=REQUEST_TIMEOUT_S, headers={ADMIN_HEADER: admin_key}) as admin,
    ):
        for i, adapter in enumerate(order):
            before = _cold_loads(admin, adapter)
            body = {"model": adapter, "prompt": "hi", "max_tokens": 4, "stream": True, "user": f"user-{i % users}"}
            sent = time.perf_counter()
            ttft = None
            with client.stream("POST", "/v1/completions", json=body) as response:
                for chunk in response.iter_bytes():
                    if chunk and ttft is None:
                        ttft = time.perf_counter() - sent
                status, headers = response.status_code, response.headers
            after = _cold_loads(admin, adapter)
            cold = None if after is None else after > (before or 0)
            workload.answers.append(
                Answer(adapter, ttft, status, headers.get(VERSION_HEADER), headers.get(FALLBACK_HEADER), cold)
            )
    workload.seconds = time.monotonic() - started
    return workload


def quantile_ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)


def summary(workload: Workload, pinned: set[str], residency: dict[str, Any]) -> dict[str, Any]:
    """Hit rate, time to first token warm and cold, the base's share, evictions per minute,
    and how the pinned adapters fared (their cold loads after their first answer)."""
    answers = workload.answers
    judged = [a for a in answers if a.cold is not None and a.fallback is None]
    warm = [a.ttft_s for a in judged if not a.cold and a.ttft_s is not None]
    cold = [a.ttft_s for a in judged if a.cold and a.ttft_s is not None]
    seen: set[str] = set()
    pinned_cold_again = 0
    for a in answers:
        if a.adapter in pinned and a.cold and a.adapter in seen:
            pinned_cold_again += 1
        seen.add(a.adapter)
    totals = residency.get("totals") or {}
    minutes = workload.seconds / 60 if workload.seconds else None
    return {
        "requests": len(answers),
        "failed": sum(1 for a in answers if a.status != 200),
        "answered_by_base": sum(1 for a in answers if a.version == "base"),
        "fallback_reasons": sorted({a.fallback for a in answers if a.fallback}),
        "hit_rate": round(len(warm) / len(judged), 4) if judged else None,
        "ttft_p95_ms": {"warm": quantile_ms(warm, 0.95), "cold": quantile_ms(cold, 0.95)},
        "cold_load_ms": {"p50": residency.get("cold_load_p50_ms"), "p99": residency.get("cold_load_p99_ms")},
        "evictions": totals.get("evictions"),
        "evictions_per_minute": round(totals.get("evictions", 0) / minutes, 2) if minutes else None,
        "pinned": sorted(pinned),
        "pinned_cold_loads_after_the_first": pinned_cold_again,
        "seconds": round(workload.seconds, 1),
    }
