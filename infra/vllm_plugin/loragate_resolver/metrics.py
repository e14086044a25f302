"""Prometheus families for live traffic, on the replica's own ``/metrics``.

vLLM's single API server serves prometheus_client's default registry; with several API
servers it sets ``PROMETHEUS_MULTIPROC_DIR`` before they start and collects every process's
files, which these families then join (the gauges keep the largest live value, the guard's
the smallest). The adapter
cache's families (``loragate_lora_*``, ``loragate_first_token_by_residency_seconds``) count
what the residency guard decided (``residency``, ``engine_cache``), a qualified
``name@version`` under ``name``. ``loragate_base_probes`` and ``loragate_base_rows_guarded``
say whether answers by the base are the base's bytes (``base_probe``, ``cpu_lora_ops``).
Without prometheus_client (the plugin's unit tests outside vLLM's venv) every call is a no-op.
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
            "lora_cache": Counter(
                "loragate_lora_cache", "Adapter cache outcomes of split requests", ["adapter", "outcome"]
            ),
            "lora_evictions": Counter(
                "loragate_lora_evictions", "Adapters pushed out of the engine's cache by a cold load", ["adapter"]
            ),
            "lora_cold_load": Histogram(
                "loragate_lora_cold_load_seconds",
                "Time to the first body chunk of a request that loaded its adapter",
                ["adapter"],
                buckets=buckets,
            ),
            "lora_resident": Gauge(
                "loragate_lora_resident", "Adapters the residency guard holds resident", multiprocess_mode="livemax"
            ),
            "lora_pinned": Gauge(
                "loragate_lora_pinned", "Adapters pinned in the engine's cache", multiprocess_mode="livemax"
            ),
            "base_probes": Counter(
                "loragate_base_probes",
                "The base's known-answer probe while adapters ran: match, or mismatch (not the base's bytes)",
                ["outcome"],
            ),
            "base_rows_guarded": Gauge(
                "loragate_base_rows_guarded",
                "1 where vLLM's CPU LoRA ops keep every adapter's delta off the base's rows",
                multiprocess_mode="livemin",
            ),
            "first_token_by_residency": Histogram(
                "loragate_first_token_by_residency_seconds",
                "Time to the first body chunk per adapter, warm (resident) or cold (loaded for it)",
                ["adapter", "residency"],
                buckets=buckets,
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


def lora_cache(adapter: str, outcome: str) -> None:
    families = _get()
    if families:
        families["lora_cache"].labels(adapter, outcome).inc()


def lora_eviction(adapter: str) -> None:
    families = _get()
    if families:
        families["lora_evictions"].labels(adapter).inc()


def lora_cold_load(adapter: str, seconds: float) -> None:
    families = _get()
    if families:
        families["lora_cold_load"].labels(adapter).observe(seconds)


def lora_cache_size(resident: int, pinned: int) -> None:
    families = _get()
    if families:
        families["lora_resident"].set(resident)
        families["lora_pinned"].set(pinned)


def first_token_by_residency(adapter: str, residency: str, seconds: float) -> None:
    families = _get()
    if families:
        families["first_token_by_residency"].labels(adapter, residency).observe(seconds)


def base_probe(outcome: str) -> None:
    families = _get()
    if families:
        families["base_probes"].labels(outcome).inc()


def base_rows_guarded(guarded: bool) -> None:
    families = _get()
    if families:
        families["base_rows_guarded"].set(1 if guarded else 0)
