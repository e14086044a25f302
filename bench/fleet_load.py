"""A rollback while clients keep asking the replicas for the adapter (``bench/fleet.py``'s
``under_load`` section): the incident case, where the fleet is busy when someone needs the
previous version back.

Every production replica has a client looping on the logical name (``threads`` requests in
flight each). Rollbacks and promotions back run in turn, as ``loragate rollback`` does them
(``rollback_and_switch``: the registry's move, every replica switched and verified on the
golden prompts, the commit). Reported: each rollback's wall time against the target, where it
went (the replica switch -- unload and load -- and the golden completions, per replica, timed
around the fleet switch's own calls), ``loragate rollback`` as a process of its own, and what
the clients saw meanwhile (failures, answers of neither version).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import loragate.tasks.fleet
from bench.cores import cores_split
from bench.fleet_setup import Setup, bench_cli_rollback, check_verified, log, promote_back, rollback, seconds, use_fleet
from bench.fleet_traffic import LoopingClient, latency
from loragate.local.replica import VllmReplica

# item 3 of issue 18: a rollback under traffic serves the previous version everywhere within this
ROLLBACK_TARGET_S = 3.0


# what a rollback's time is spent on, each timed around the call the fleet switch makes (it
# calls them by module or class attribute): before the lock, the copies made ready; under it,
# the whole fleet switch: the resolver indexes written, then each replica's move (its client,
# the unload-and-load, the card and golden completions), the replicas in parallel
PHASES: dict[str, tuple[Any, str]] = {
    "copies_before_lock": (loragate.tasks.fleet.ReadyCopies, "prepare_rollback"),
    "fleet_switch_under_lock": (loragate.tasks.fleet.FleetSwitch, "apply"),
    "index_write": (loragate.tasks.fleet.FleetSwitch, "_write_indexes"),
    "per_replica_move": (loragate.tasks.fleet.FleetSwitch, "_move"),
    "per_replica_switch": (loragate.tasks.fleet, "switch_replica"),
    "per_replica_golden_completions": (loragate.tasks.fleet, "verify_replica"),
}


@contextlib.contextmanager
def timed_calls(taken: dict[str, list[float]]) -> Iterator[None]:
    """Add to ``taken`` the wall time of every call of the ``PHASES`` it names while the
    block runs."""
    originals = {n: getattr(*PHASES[n]) for n in taken}

    def timing(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                taken[name].append(time.perf_counter() - started)

        return wrapper

    for name, fn in originals.items():
        setattr(PHASES[name][0], PHASES[name][1], timing(name, fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(PHASES[name][0], PHASES[name][1], fn)


def bench_under_load(
    setup: Setup,
    urls: list[str],
    adapter_dir: Path,
    rounds: int,
    threads: int,
    *,
    cli: bool = True,
    client_cpus: list[int] | None = None,
) -> dict[str, Any]:
    """``cli``: also ``loragate rollback`` as a process of its own, under the same load;
    ``client_cpus``: the cores the clients' threads run on."""
    use_fleet(setup, urls, adapter_dir)
    answers = set(setup.answers.values())
    clients = [
        LoopingClient(url, setup.name, setup.prompt, setup.max_tokens, threads=threads, cpus=client_cpus)
        for url in urls
    ]
    back: list[float] = []
    forth: list[float] = []
    with contextlib.ExitStack() as running:
        for client in clients:
            running.enter_context(client.running())
        loaded_from = time.perf_counter()
        time.sleep(1.0)  # the clients are in full swing before the first rollback
        taken: dict[str, list[float]] = {phase: [] for phase in PHASES}
        for _ in range(rounds):
            started = time.perf_counter()
            with timed_calls(taken):
                report = rollback(setup)
            back.append(time.perf_counter() - started)
            check_verified(report, len(urls))
            # promotions back are timed, not broken down: they are not the incident
            started = time.perf_counter()
            report = promote_back(setup)
            forth.append(time.perf_counter() - started)
            check_verified(report, len(urls))
        cli_s = bench_cli_rollback(setup) if cli else None
        loaded_s = time.perf_counter() - loaded_from
    requests = [r for c in clients for r in c.requests]
    result = {
        "replicas": len(urls),
        "requests_in_flight_per_replica": threads,
        "rollback": seconds(back),
        "promote_back": seconds(forth),
        # a rollback: copies before the lock, then one fleet switch that switches and verifies
        # every replica in parallel; the rest of its time is the registry's move and commit
        "phases": {phase: seconds(samples) for phase, samples in taken.items()},
        "cli_rollback_s": None if cli_s is None else round(cli_s, 3),
        "traffic": latency(requests, answers, over_s=loaded_s),
        "target_s": ROLLBACK_TARGET_S,
        "target_met": max(back) <= ROLLBACK_TARGET_S,
    }
    log(
        f"under load ({threads} in flight per replica): rollback median {result['rollback']['median_s']}s, "
        f"max {result['rollback']['max_s']}s; loragate rollback {result['cli_rollback_s']} s"
    )
    return result


def under_load_sections(
    setup: Setup,
    replicas: list[VllmReplica],
    urls: list[str],
    adapter_dir: Path,
    rounds: int,
    threads: int,
    *,
    cli: bool = True,
    split: bool = False,
) -> dict[str, Any]:
    """``under_load`` on the first 2 replicas; ``split``: then ``under_load_cores_split``,
    the same with ``replicas`` and the clients on the last core, this process (and the
    command it starts) on the others."""
    out = {"under_load": bench_under_load(setup, urls[:2], adapter_dir, rounds, threads, cli=cli)}
    if split:
        with cores_split(replicas) as cores:
            log(f"under load again, cores split: {cores}")
            pinned = cores["replicas_and_clients"]
            loaded = bench_under_load(setup, urls[:2], adapter_dir, rounds, threads, cli=cli, client_cpus=pinned)
            out["under_load_cores_split"] = {"cores": cores, **loaded}
    return out
