"""The event loop's stall while a replica's live figures are read: the p99 gap between two
tokens of a stream while the fleet reads the figures, against the same without a read.

A replica's API server streams every client's tokens from one asyncio event loop, the loop
that also serves ``GET /loragate/traffic`` (the fleet's key): the plugin copies the entries
asked for on the loop, yielding every few, and renders the JSON in a worker thread
(``infra/vllm_plugin/loragate_resolver/figures.py``). Whatever of that still holds the loop
-- or the GIL the loop's thread needs -- shows as a late token in every stream on the replica.

Setup: one production replica, K adapters in production on Postgres
(``bench.scale_restart.registry_with_production``), reconciled; then users' requests through
the split, ``--requests`` for each of the K names (``--clients`` at once; the residency guard
off, so each adapter's own version answers, never the base), so the replica holds figures for
every one. One full read of them is recorded: its bytes, and one ``read_live_figures`` call
(the fleet's own, parsing included) with the adapters it found figures for.

Measure: one streaming client (``stream: true``, ``--max-tokens`` tokens with ``ignore_eos``
on one warm adapter, ``--streams`` in sequence) times the gap between consecutive ``data:``
lines (``time.perf_counter``), under each condition in turn, alternated ``--rounds`` times on
the same replica so drift falls on all alike:

- ``none``: no reads;
- ``filtered``: a reader doing what one evaluation does, back to back: every K adapter named
  (``adapter=``), ``ADAPTERS_PER_READ`` a GET, as ``read_live_figures`` chunks them;
- ``unfiltered``: ``GET /loragate/traffic`` with no filter, back to back (the worst case).

The reader sends the GETs ``ReplicaClient.traffic`` sends but leaves the bytes unparsed:
parsing them here would take this process's GIL from the streaming client and show as gaps
that are not the replica's. On a machine where the API server shares cores with the engine,
the render's CPU is the engine's too: the gap is the loop's stall and that contention together.

A gap is as the client sees it: lines that arrive together are ~0 apart and the wait before
them is one long gap, so the p50 can be ~0 and the mean is the engine's time per token.
Per condition: the gaps' p50/p99/max, their count and how many exceed 50 ms, and for a
reader its reads (count, p50/p99 duration, bytes); ``p99_ratio``: each reader's p99 over
``none``'s.
``--smoke``: 4 adapters, 2 requests each, 2 rounds of one 64-token stream.

    .venv/bin/python -m bench.stall [--adapters 200] [--requests 4] [--out FILE]
                                    [--production URL --adapter-dir DIR --replica-secrets DIR]

With ``--production`` it drives a replica already running (the smoke test passes the test
session's, whose guard refuses nothing), its secrets put back at the end.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from bench.harness import (
    add_running_replica_arguments,
    check_running_replica_arguments,
    emit,
    one_production_replica,
    replicas_obey,
    secrets_put_back,
    work_directory,
)
from bench.residency_workload import ADMIN_HEADER, FALLBACK_HEADER, VERSION_HEADER
from bench.scale_restart import registry_with_production
from bench.timing import summarize
from kit.basekit import build_base
from kit.modelkit import train_adapter
from kit.postgres import admin_engine, drop_database
from kit.tenant_tasks import write_golden_set
from loragate.local.replica import start_replicas, stop_replicas
from loragate.registry.service import Registry
from loragate.tasks.live_figures import ADAPTERS_PER_READ, read_live_figures
from loragate.tasks.reconcile import reconcile_fleet

BASE_ID = "tiny-llama"
# every adapter's own version answers (no minimum residency, no cap on evictions): its
# figures are its version's, not the base's
GUARD_OFF = {"LORAGATE_MIN_RESIDENCY_S": "0", "LORAGATE_EVICTIONS_PER_MINUTE": "1000000"}
PROMPT = "hi"
TRAFFIC_TOKENS = 16  # a whole answer gives a time per token from 16 tokens (traffic_flow)
STREAM_USER = "stall-stream"
CONDITIONS = ("none", "filtered", "unfiltered")
TIMEOUT_S = 300.0
# the replica's context is 256 tokens (replica_config): the prompt and its BOS leave room for 240
MAX_TOKENS = 240
STALL_NS = 50_000_000  # a gap this long is counted as a stall whatever the quantiles say


def log(message: str) -> None:
    print(f"[bench/stall] {message}", file=sys.stderr, flush=True)


def chunks(names: list[str]) -> list[list[str]]:
    """The adapters of each GET, as ``read_live_figures`` sends them."""
    return [names[i : i + ADAPTERS_PER_READ] for i in range(0, len(names), ADAPTERS_PER_READ)]


def send_traffic(url: str, names: list[str], per_adapter: int, clients: int) -> dict[str, Any]:
    """``per_adapter`` users' requests for each of ``names`` through the split, ``clients`` at
    once (an adapter's requests next to each other: one load serves them)."""
    asked = [(name, i) for name in names for i in range(per_adapter)]

    def ask(client: httpx.Client, name: str, i: int) -> tuple[int, str | None, str | None]:
        body = {
            "model": name,
            "prompt": PROMPT,
            "max_tokens": TRAFFIC_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "user": f"user-{i}",
        }
        answered = client.post("/v1/completions", json=body)
        return answered.status_code, answered.headers.get(VERSION_HEADER), answered.headers.get(FALLBACK_HEADER)

    started = time.monotonic()
    with (
        httpx.Client(base_url=url, timeout=TIMEOUT_S) as client,
        concurrent.futures.ThreadPoolExecutor(clients) as pool,
    ):
        answers = list(pool.map(lambda a: ask(client, *a), asked))
    return {
        "requests": len(answers),
        "failed": sum(1 for status, _, _ in answers if status != 200),
        "answered_by_base": sum(1 for _, version, _ in answers if version == "base"),
        "fallbacks": sum(1 for _, _, fallback in answers if fallback),
        "clients": clients,
        "seconds": round(time.monotonic() - started, 1),
    }


def read_once(admin: httpx.Client, groups: list[list[str]] | None) -> int:
    """One full read of the figures, its bytes: a GET per group of adapters, or one GET
    with no filter (``groups`` None)."""
    size = 0
    for group in groups if groups is not None else [None]:
        params = [("adapter", name) for name in group] if group is not None else None
        answered = admin.get("/loragate/traffic", params=params)
        answered.raise_for_status()
        size += len(answered.content)
    return size


class Reader:
    """Full reads back to back in a thread of its own until ``stop``: each read's duration
    and bytes."""

    def __init__(self, admin: httpx.Client, groups: list[list[str]] | None) -> None:
        self.admin, self.groups = admin, groups
        self.durations_ns: list[int] = []
        self.sizes: list[int] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                t = time.perf_counter_ns()
                size = read_once(self.admin, self.groups)
                self.durations_ns.append(time.perf_counter_ns() - t)
                self.sizes.append(size)
        except BaseException as e:  # the condition reports it; the stream goes on
            self.error = e

    def __enter__(self) -> Reader:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def stream_gaps(client: httpx.Client, name: str, max_tokens: int) -> tuple[list[int], str | None]:
    """One stream's gaps between consecutive tokens (``data:`` lines), in nanoseconds, and
    the version that answered it."""
    body = {
        "model": name,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "user": STREAM_USER,
    }
    gaps: list[int] = []
    last: int | None = None
    with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code != 200:
            response.read()
            raise RuntimeError(f"the stream answered {response.status_code}: {response.text[:300]}")
        version = response.headers.get(VERSION_HEADER)
        for line in response.iter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            now = time.perf_counter_ns()
            if last is not None:
                gaps.append(now - last)
            last = now
    return gaps, version


def measure(
    url: str, admin_key: str, names: list[str], stream_name: str, rounds: int, streams: int, max_tokens: int
) -> dict[str, Any]:
    """The conditions alternated ``rounds`` times, ``streams`` streams each time."""
    gaps: dict[str, list[int]] = {c: [] for c in CONDITIONS}
    reads: dict[str, list[int]] = {c: [] for c in CONDITIONS}
    sizes: dict[str, list[int]] = {c: [] for c in CONDITIONS}
    versions: dict[str, set[str | None]] = {c: set() for c in CONDITIONS}
    errors: dict[str, str] = {}
    groups = {"none": None, "filtered": chunks(names), "unfiltered": None}
    with (
        httpx.Client(base_url=url, timeout=TIMEOUT_S) as client,
        httpx.Client(base_url=url, timeout=TIMEOUT_S, headers={ADMIN_HEADER: admin_key}) as admin,
    ):
        stream_gaps(client, stream_name, max_tokens)  # warm: the adapter loaded, the path taken
        for r in range(rounds):
            for condition in CONDITIONS:
                reader = Reader(admin, groups[condition]) if condition != "none" else None
                with reader or contextlib.nullcontext():
                    for _ in range(streams):
                        found, version = stream_gaps(client, stream_name, max_tokens)
                        gaps[condition] += found
                        versions[condition].add(version)
                if reader is not None:
                    reads[condition] += reader.durations_ns
                    sizes[condition] += reader.sizes
                    if reader.error is not None:
                        errors[condition] = f"{type(reader.error).__name__}: {reader.error}"
            log(f"round {r + 1}/{rounds}: " + ", ".join(f"{c} {len(gaps[c])} gaps" for c in CONDITIONS))
    result: dict[str, Any] = {}
    for condition in CONDITIONS:
        entry: dict[str, Any] = {
            "gaps": {
                **(summarize(gaps[condition]) if gaps[condition] else {"n": 0}),
                "over_50ms": sum(1 for g in gaps[condition] if g > STALL_NS),
            },
            "versions": sorted(str(v) for v in versions[condition]),
        }
        if condition != "none":
            entry["reads"] = {
                **(summarize(reads[condition]) if reads[condition] else {"n": 0}),
                "bytes": int(statistics.median(sizes[condition])) if sizes[condition] else None,
                "requests_per_read": len(groups[condition] or [None]),
            }
        if condition in errors:
            entry["error"] = errors[condition]
        result[condition] = entry
    return result


def figures_held(url: str, admin_key: str, registry: Registry, names: list[str]) -> dict[str, Any]:
    """What one full read of the figures is: its bytes, filtered and not, the adapters the
    replica has figures for, and one ``read_live_figures`` call."""
    with httpx.Client(base_url=url, timeout=TIMEOUT_S, headers={ADMIN_HEADER: admin_key}) as admin:
        t = time.perf_counter()
        filtered = read_once(admin, chunks(names))
        filtered_ms = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        unfiltered = read_once(admin, None)
        unfiltered_ms = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    live = read_live_figures(registry, names)
    live_s = time.perf_counter() - t
    with_versions = sum(1 for name in names if any(d.get("versions") for d in live.of(name).documents))
    return {
        "filtered_read": {"bytes": filtered, "requests": len(chunks(names)), "ms": round(filtered_ms, 1)},
        "unfiltered_read": {"bytes": unfiltered, "requests": 1, "ms": round(unfiltered_ms, 1)},
        "read_live_figures": {
            "s": round(live_s, 3),
            "adapters_with_figures": with_versions,
            "unreadable": sorted(live.unreadable.values()),
        },
    }


def ratio(a: Any, b: Any) -> float | None:
    return round(a / b, 2) if isinstance(a, int | float) and isinstance(b, int | float) and b else None


def run(args: argparse.Namespace, registry: Registry, base_dir: Path, work: Path) -> dict[str, Any]:
    names = sorted(a.name for a in registry.adapter_pointers())
    secrets_dir, admin_key = replicas_obey(registry, args.replica_secrets or work / "replica-secrets")
    # a running replica's guard must refuse nothing, as GUARD_OFF (the test session's does)
    replica, url, adapter_dir = one_production_replica(
        args, base_dir, BASE_ID, work, secrets_dir, traffic_env=GUARD_OFF
    )
    added = False
    try:
        t = time.monotonic()
        if replica is not None:
            start_replicas([replica])
        started_s = round(time.monotonic() - t, 1)
        registry.add_replica(url, BASE_ID, "production", str(adapter_dir))
        added = True
        t = time.monotonic()
        reconcile_fleet(registry)
        reconcile_s = round(time.monotonic() - t, 1)
        log(f"replica up in {started_s} s, reconciled in {reconcile_s} s; users' requests for {len(names)} adapters")
        traffic = send_traffic(url, names, args.requests, args.clients)
        figures = figures_held(url, admin_key, registry, names)
        log(f"traffic {traffic}; figures {figures}")
        conditions = measure(url, admin_key, names, names[0], args.rounds, args.streams, args.max_tokens)
        base = conditions["none"]["gaps"].get("p99_ms")
        return {
            "replica_start_s": started_s,
            "reconcile_s": reconcile_s,
            "traffic": traffic,
            "figures": figures,
            "stream": {
                "adapter": names[0],
                "max_tokens": args.max_tokens,
                "streams_per_condition_per_round": args.streams,
                "rounds": args.rounds,
                "order": list(CONDITIONS),
            },
            "conditions": conditions,
            "p99_ratio": {c: ratio(conditions[c]["gaps"].get("p99_ms"), base) for c in CONDITIONS if c != "none"},
        }
    finally:
        if replica is not None:
            stop_replicas([replica])
        if added:
            registry.remove_replica(url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--adapters", type=int, default=200, help="adapters in production, each with figures")
    parser.add_argument("--requests", type=int, default=4, help="users' requests per adapter before measuring")
    parser.add_argument("--clients", type=int, default=4, help="those requests in flight at once")
    parser.add_argument("--rounds", type=int, default=4, help="times the conditions are alternated")
    parser.add_argument("--streams", type=int, default=3, help="streams per condition in each round")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS, help=f"tokens per stream (at most {MAX_TOKENS})")
    parser.add_argument(
        "--smoke", action="store_true", help="4 adapters, 2 requests each, 2 rounds of one 64-token stream"
    )
    add_running_replica_arguments(parser)
    parser.add_argument("--base", type=Path, help="the tiny base (else one is built)")
    parser.add_argument("--bundle", type=Path, help="a trained support adapter of the base (else one is trained)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    if args.smoke:
        args.adapters, args.requests, args.rounds, args.streams, args.max_tokens = 4, 2, 2, 1, 64
    if not 0 < args.max_tokens <= MAX_TOKENS:
        parser.error(f"--max-tokens is between 1 and {MAX_TOKENS} (the replica's context is 256 tokens)")
    if min(args.adapters, args.requests, args.clients, args.rounds, args.streams) < 1:
        parser.error("--adapters, --requests, --clients, --rounds and --streams are at least 1")
    wall = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "stall",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "smoke": args.smoke,
        "adapters": args.adapters,
        "requests_per_adapter": args.requests,
    }
    check_running_replica_arguments(parser, args)
    with work_directory("loragate-bench-stall-") as work, secrets_put_back(args.replica_secrets):
        base_dir = args.base or build_base(work / "tiny-llama")
        golden = write_golden_set("support", work / "golden.jsonl")
        bundle = args.bundle or train_adapter(base_dir, "support", work / "support")
        t = time.monotonic()
        registry, database = registry_with_production(work, base_dir, bundle, golden, args.adapters)
        result["setup_s"] = round(time.monotonic() - t, 1)
        try:
            result.update(run(args, registry, base_dir, work))
        finally:
            registry.close()
            drop_database(admin_engine(), database)
    result["wall_s"] = round(time.perf_counter() - wall, 1)
    emit(result, args.out)


if __name__ == "__main__":
    main()
