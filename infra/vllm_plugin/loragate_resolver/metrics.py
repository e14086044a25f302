"""Prometheus families for live traffic, on the replica's own ``/metrics``.

vLLM's single API server serves prometheus_client's default registry; with several API
servers it sets ``PROMETHEUS_MULTIPROC_DIR`` before they start and collects every process's
files, which these families then join (the gauge keeps the largest live value). Without
prometheus_client (the plugin's unit tests outside vLLM's venv) every call is a no-op.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("loragate_resolver.metrics")
_families: dict[str, Any] | None = None


def _get() -> dict[str, Any]:
    global _families
    if _families is not None:
        return _families
    try:
        from prometheus_client import Counter, Gauge, Histogram
    except ImportError:
        _families = {}
        return _families
    buckets = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
    try:
        _families = {
            "requests": Counter(
                "loragate_requests", "Client requests per adapter version", ["adapter", "version", "outcome"]
            ),
            "seconds": Histogram(
                "loragate_request_seconds",
                "End-to-end latency per adapter version",
                ["adapter", "version"],
                buckets=buckets,
            ),
            "first_token": Histogram(
                "loragate_first_token_seconds",
                "Time to the first body chunk per adapter version",
                ["adapter", "version"],
                buckets=buckets,
            ),
            "fallbacks": Counter("loragate_fallbacks", "Requests answered by a fallback", ["adapter", "reason"]),
            "breaker": Gauge(
                "loragate_breaker_open",
                "1 while the version's breaker is open on this replica",
                ["adapter", "version"],
                multiprocess_mode="livemax",
            ),
        }
    except ValueError:  # registered twice in one process (a test re-importing): stay quiet
        log.warning("loragate: live-traffic metrics already registered; not exported again")
        _families = {}
    return _families


def request(adapter: str, version: str, outcome: str, seconds: float | None, first_token_s: float | None) -> None:
    families = _get()
    if not families:
        return
    families["requests"].labels(adapter, version, outcome).inc()
    if seconds is not None:
        families["seconds"].labels(adapter, version).observe(seconds)
    if first_token_s is not None:
        families["first_token"].labels(adapter, version).observe(first_token_s)


def fallback(adapter: str, reason: str) -> None:
    families = _get()
    if families:
        families["fallbacks"].labels(adapter, reason).inc()


def breaker(adapter: str, version: str, is_open: bool) -> None:
    families = _get()
    if families:
        families["breaker"].labels(adapter, version).set(1 if is_open else 0)
