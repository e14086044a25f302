"""Moving live traffic off a version while users keep asking (``bench/traffic.py``,
sections ``withdraw`` and ``rollback``).

Every production replica has a client looping on the adapter's name, each request as a new
user, every core shared by the replicas, the clients and the fleet control. What counts is
what users see: the time from the move's start to the last answer that the version moved
off gave (by the ``x-loragate-version`` header, and by what the answer says: each version
answers the probe prompt its own way), and whether any request begun after the move
returned still got it.

- ``withdraw``: the canary at share 0.5 set to 0 (``loragate.tasks.traffic.set_share``, which pushes
  the routes to every replica).
- ``rollback``: ``rollback_and_switch`` (what ``loragate rollback`` runs) two ways in the
  same run, rounds interleaved: ``routing``, the previous production kept warm as
  ``name@version`` (as ``promote_canary`` leaves it: ``loragate.tasks.traffic.warm_version``), so the
  rollback moves traffic and confirms it per replica; ``reload``, the previous version not
  warm (``cool_version`` first), so each replica reloads it and re-runs the golden
  completions behind the traffic -- the path every rollback took before. Then
  ``loragate rollback`` as a process of its own, each way.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import loragate.tasks.fleet
from bench.fleet_setup import Setup, promote_back
from bench.traffic_clients import Answer, UserLoop, last_answer_of, wait_for_answers
from loragate.tasks.fleet import rollback_and_switch
from loragate.tasks.routes import production_replicas, serves_warm
from loragate.tasks.traffic import cool_version, warm_version

ROLLBACK_TARGET_S = 3.0
# answers each client must have begun after a move before its last old answer is read
SETTLE_ANSWERS = 3
SETTLE_DEADLINE_S = 60.0
CLI_DEADLINE_S = 300.0
PATHS = ("routing", "reload")
# where a rollback's time goes, each timed around the call the fleet switch makes (by module
# or class attribute): the copies checked before the lock; under it, the whole switch, the
# warm check, each replica's move (unload, or switch and golden completions); after the
# commit, the routes pushed, every replica confirmed by the version header, and the warm
# copies settled (production under its plain name again, the rolled-back copy unloaded)
PHASES: dict[str, tuple[Any, str]] = {
    "copies_before_lock": (loragate.tasks.fleet.ReadyCopies, "prepare_rollback"),
    "fleet_switch_under_lock": (loragate.tasks.fleet.FleetSwitch, "apply"),
    "warm_check": (loragate.tasks.fleet.FleetSwitch, "_warm"),
    "per_replica_move": (loragate.tasks.fleet.FleetSwitch, "_move"),
    "per_replica_golden_completions": (loragate.tasks.fleet, "verify_replica"),
    "after_commit": (loragate.tasks.fleet.FleetSwitch, "after_commit"),
    "push_routes": (loragate.tasks.fleet, "push_routes"),
    "confirm_version": (loragate.tasks.fleet, "confirm_version"),
    "settle_warm_copies": (loragate.tasks.fleet, "settle_warm_copies"),
}


@contextlib.contextmanager
def timed_phases() -> Iterator[dict[str, list[float]]]:
    """Seconds of every call of each of ``PHASES`` while the block runs."""
    taken: dict[str, list[float]] = {name: [] for name in PHASES}
    originals = {name: getattr(owner, attr) for name, (owner, attr) in PHASES.items()}

    def timing(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                taken[name].append(round(time.perf_counter() - started, 3))

        return wrapper

    for name, fn in originals.items():
        setattr(PHASES[name][0], PHASES[name][1], timing(name, fn))
    try:
        yield taken
    finally:
        for name, fn in originals.items():
            setattr(PHASES[name][0], PHASES[name][1], fn)


@contextlib.contextmanager
def looping(setup: Setup, urls: list[str], threads: int) -> Iterator[list[UserLoop]]:
    loops = [UserLoop(url, setup.name, setup.prompt, setup.max_tokens, threads=threads) for url in urls]
    with contextlib.ExitStack() as stack:
        for loop in loops:
            stack.enter_context(loop.running())
        yield loops


def _all(loops: list[UserLoop]) -> list[Answer]:
    return [a for loop in loops for a in loop.answers]


def bench_withdraw(
    setup: Setup, urls: list[str], set_share: Callable[[float], None], rounds: int, threads: int
) -> dict[str, Any]:
    """The canary (``setup.v2``, on its window) from share 0.5 to 0, ``rounds`` times."""
    canary = setup.v2
    samples = []
    with looping(setup, urls, threads) as loops:
        for _ in range(rounds):
            set_share(0.5)
            before = time.perf_counter()
            wait_for_answers(loops, before, SETTLE_ANSWERS, SETTLE_DEADLINE_S)
            started = time.perf_counter()
            set_share(0.0)
            returned = time.perf_counter()
            settled = wait_for_answers(loops, returned, SETTLE_ANSWERS, SETTLE_DEADLINE_S)
            answers = _all(loops)
            samples.append(
                {
                    "set_share_s": round(returned - started, 3),
                    "canary_answers_at_half": sum(
                        a.ok and a.version == canary and before < a.started < started for a in answers
                    ),
                    **last_answer_of(answers, canary, started, returned, setup.answers),
                    "settled": settled,
                }
            )
        failed = sum(not a.ok for a in _all(loops))
    return {
        "rounds": samples,
        "failed_requests": failed,
        "to_last_answer_s_max": max(s["to_last_answer_s"] for s in samples),
    }


def _prepare(setup: Setup, path: str, previous: str) -> bool:
    """Production is on the newer version; the previous warm (routing) or not (reload) on
    every production replica. Whether it is as asked."""
    if path == "routing":
        warm_version(setup.registry, setup.name, previous)
    else:
        cool_version(setup.registry, setup.name, previous)
    warm = [
        serves_warm(setup.registry, r, setup.name, previous) for r in production_replicas(setup.registry, setup.name)
    ]
    return all(warm) if path == "routing" else not any(warm)


def _restore(setup: Setup, version: str) -> None:
    """``version`` production again after a rollback (through canary: a rolled-back version
    goes there first), the fleet switched and verified; done before the next rollback, not
    after the last."""
    if setup.production() != version:
        promote_back(setup)


def _cli(setup: Setup) -> tuple[list[dict[str, Any]], float]:
    """``loragate rollback NAME --json`` as an operator runs it: its rows and wall time."""
    env = {**os.environ, **setup.env(), "LORAGATE_TOKEN": setup.registry.create_token("activation", "bench")[1]}
    command = [str(Path(sys.executable).parent / "loragate"), "rollback", setup.name, "--json"]
    started = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False, timeout=CLI_DEADLINE_S)
    took = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"bench: loragate rollback exited {proc.returncode}: {proc.stderr[-2000:]}")
    try:
        rows = json.loads(proc.stdout).get("replicas", [])
    except ValueError:
        rows = []
    return rows, took


def _one_rollback(setup: Setup, loops: list[UserLoop], path: str, cli: bool) -> dict[str, Any]:
    rolled_back = setup.v2
    _restore(setup, rolled_back)
    previous = setup.previous()
    as_asked = _prepare(setup, path, previous)
    time.sleep(0.5)  # the clients in full swing on the version to be rolled back
    phases: dict[str, list[float]] = {}
    started = time.perf_counter()
    if cli:
        report, _ = _cli(setup)
    else:
        with timed_phases() as phases:
            _, report = rollback_and_switch(setup.registry, setup.name, "production", reason=f"bench: {path}")
    returned = time.perf_counter()
    settled = wait_for_answers(loops, returned, SETTLE_ANSWERS, SETTLE_DEADLINE_S)
    sample = {
        "path": path,
        "previous_as_asked": as_asked,
        "rollback_s": round(returned - started, 3),
        **last_answer_of(_all(loops), rolled_back, started, returned, setup.answers),
        "verified": sorted({str(r.get("verified")) for r in report}),
        "confirmed_s": [r.get("confirmed_s") for r in report],
        **({"phases_s": {name: spent for name, spent in phases.items() if spent}} if phases else {}),
        "settled": settled,
    }
    return sample


def bench_rollback(
    setup: Setup, urls: list[str], rounds: int, threads: int, cli: bool, log: Callable[[str], None]
) -> dict[str, Any]:
    """``rounds`` rollbacks each way (ABBA), then ``loragate rollback`` each way (``cli``)."""
    samples: dict[str, list[dict[str, Any]]] = {p: [] for p in PATHS}
    commands: dict[str, dict[str, Any]] = {}
    with looping(setup, urls, threads) as loops:
        time.sleep(1.0)
        for r in range(rounds):
            for path in PATHS if r % 2 == 0 else PATHS[::-1]:
                sample = _one_rollback(setup, loops, path, cli=False)
                samples[path].append(sample)
                log(
                    f"rollback ({path}): {sample['rollback_s']} s, last old answer after {sample['to_last_answer_s']} s"
                )
        if cli:
            for path in PATHS:
                commands[path] = _one_rollback(setup, loops, path, cli=True)
                log(f"loragate rollback ({path}): {commands[path]['rollback_s']} s")
        answers = _all(loops)
    result: dict[str, Any] = {"replicas": len(urls), "requests_in_flight_per_replica": threads}
    for path in PATHS:
        rows = samples[path]
        result[path] = {
            "rounds": rows,
            "rollback_s_max": max(s["rollback_s"] for s in rows),
            "to_last_answer_s_max": max(s["to_last_answer_s"] for s in rows),
        }
        if path in commands:
            result[path]["command"] = commands[path]
    result["speedup_rollback_s"] = _ratio(result["reload"]["rollback_s_max"], result["routing"]["rollback_s_max"])
    result["traffic"] = {
        "requests": len(answers),
        "failed": sum(not a.ok for a in answers),
        "fallbacks": sum(a.ok and a.fallback is not None for a in answers),
    }
    return result


def _ratio(slow: float, fast: float) -> float | None:
    return round(slow / fast, 2) if fast else None
