"""The live error rule's false rollbacks and catches, on simulated windows with a fixed seed.

Each window is 24 h evaluated every 600 s (144 looks) at a 1 % share. Per look each side
answers a Poisson number of requests and each fails on its own with the side's rate; in a
``burst`` window a fault that every version shares (overload, an engine restart) makes 30 %
of both sides' requests fail for three looks. The rule is loragate's own
(``ErrorEvidence``, at the quarter of ``LORAGATE_CANARY_FALSE_ROLLBACK`` it holds); the peer
in the same run is the rule it replaced, Fisher's one-sided test on the cumulative counts at
every look at 0.05.

    python -m bench.verdict [--windows 1000] [--peer-windows 200] [--smoke] [--out FILE]

Prints JSON: per traffic and error rate the share of windows a version failing as
production does was rolled back in (with Wilson's 95 % interval), and per worse version the
share caught and the median hours to its rollback. **Few users**: tenants of 5 to 2,000 sticky
users (each sending a Poisson 3 requests per 10 min, each in the canary while its bucket is
below the share), the split ramped by loragate's own rule (``rules/power.py``) within 10 %:
the share of windows decided (ready with the requests needed, or rolled back) and undecided,
for a version as good as production and one failing 2x as often. **Users as the unit**:
Zipf users whose failures cluster, against the same rule counting requests as units
(``bench/verdict_users.py``). **Latency**: the probe and live latency rules on their own
simulated windows (``bench/verdict_latency.py``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from bench.verdict_latency import latency_rows
from bench.verdict_users import users_rows
from bench.verdict_windows import LOOK_S, LOOKS, proportion
from loragate.registry.rules.canary import CanaryThresholds
from loragate.registry.rules.power import coverage, ramped_share
from loragate.registry.rules.sequential import ErrorEvidence, rule_alpha
from loragate.registry.rules.significance import fisher_exact_greater

ROOT = Path(__file__).resolve().parents[1]
SHARE = 0.01
FALSE_ROLLBACK = 0.01  # LORAGATE_CANARY_FALSE_ROLLBACK's default
PEER_ALPHA = 0.05  # the replaced rule: 1 - LORAGATE_CANARY_CONFIDENCE at every look
BURST_RATE, BURST_LOOKS = 0.30, 3


@dataclass(frozen=True)
class Case:
    per_look: int  # the adapter's requests per 600 s, both sides
    production_rate: float
    canary_rate: float
    burst: bool = False

    @property
    def label(self) -> dict[str, Any]:
        return {
            "requests_per_10_min": self.per_look,
            "production_error_rate": self.production_rate,
            "canary_error_rate": self.canary_rate,
            "shared_fault_burst": self.burst,
        }


def _rates(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    canary = np.full(LOOKS, case.canary_rate)
    production = np.full(LOOKS, case.production_rate)
    if case.burst:
        hit = rng.choice(LOOKS, BURST_LOOKS, replace=False)
        canary[hit] = production[hit] = BURST_RATE
    return canary, production


def first_rollbacks(case: Case, windows: int, seed: int, peer: bool) -> list[tuple[int | None, int | None]]:
    """Per window: the look the rule rolled it back at, and the look the peer would have
    (None: never, or the peer not run)."""
    rng = np.random.default_rng(seed)
    alpha = rule_alpha(FALSE_ROLLBACK)
    out = []
    for _ in range(windows):
        canary_rate, production_rate = _rates(case, rng)
        canary_requests = rng.poisson(SHARE * case.per_look, LOOKS)
        production_requests = rng.poisson((1 - SHARE) * case.per_look, LOOKS)
        canary_errors = rng.binomial(canary_requests, canary_rate)
        production_errors = rng.binomial(production_requests, production_rate)
        evidence, counts = ErrorEvidence.start(alpha), [0, 0, 0, 0]
        rule = fisher = None
        for look in range(LOOKS):
            step = (canary_requests[look], canary_errors[look], production_requests[look], production_errors[look])
            counts = [c + int(s) for c, s in zip(counts, step, strict=True)]
            if rule is None:
                evidence = evidence.look(*counts)
                rule = look + 1 if evidence.worse else None
            if peer and fisher is None:
                test = fisher_exact_greater(counts[1], counts[0], counts[3], counts[2])
                fisher = look + 1 if test is not None and test.p_value < PEER_ALPHA else None
            if rule is not None and (fisher is not None or not peer):
                break
        out.append((rule, fisher))
    return out


def null_case(case: Case, windows: int, peer_windows: int, seed: int) -> dict[str, Any]:
    runs = first_rollbacks(case, windows, seed, peer=False)
    peer_runs = first_rollbacks(case, peer_windows, seed + 1, peer=True) if peer_windows else []
    return {
        **case.label,
        "loragate": proportion(sum(1 for r, _ in runs if r is not None), windows, "rolled_back"),
        "fisher_every_look": proportion(sum(1 for _, f in peer_runs if f is not None), peer_windows, "rolled_back")
        if peer_windows
        else None,
    }


def worse_case(case: Case, windows: int, seed: int) -> dict[str, Any]:
    looks = [r for r, _ in first_rollbacks(case, windows, seed, peer=False) if r is not None]
    return {
        **case.label,
        "caught": proportion(len(looks), windows, "rolled_back"),
        "median_hours_to_rollback": statistics.median(looks) * LOOK_S / 3600 if looks else None,
    }


REQUESTS_PER_USER = 3  # per user per 10 min
AUTO_CAP = 0.10  # LORAGATE_CANARY_MAX_AUTO_SHARE's default
PRODUCTION_RATE = 0.01


def few_users_window(users: int, canary_ratio: float, rng: np.random.Generator) -> tuple[str, float, int]:
    """One window of a tenant of ``users`` sticky users: (outcome, final share, ramp steps);
    outcome ``ready``, ``rolled_back`` or ``undecided``, as the watch would end it."""
    length = LOOKS * LOOK_S
    detection = CanaryThresholds(
        length_s=length, detect_ratio=2.0, min_live_requests=100, false_rollback=FALSE_ROLLBACK
    ).detection
    buckets = rng.random(users)
    share, steps = SHARE, 0
    evidence, counts = ErrorEvidence.start(detection.alpha), [0, 0, 0, 0]
    for look in range(1, LOOKS + 1):
        sent = rng.poisson(REQUESTS_PER_USER, users)
        canary = int(sent[buckets < share].sum())
        production = int(sent.sum()) - canary
        step = (
            canary,
            int(rng.binomial(canary, PRODUCTION_RATE * canary_ratio)),
            production,
            int(rng.binomial(production, PRODUCTION_RATE)),
        )
        counts = [c + s for c, s in zip(counts, step, strict=True)]
        evidence = evidence.look(*counts)
        if evidence.worse:
            return "rolled_back", share, steps
        elapsed, remaining = look * LOOK_S, length - look * LOOK_S
        covered = coverage(detection, share, counts[0], counts[2], counts[3], elapsed, remaining)
        if remaining <= 0:
            return ("ready" if covered.met else "undecided"), share, steps
        raised = ramped_share(detection, covered, counts[2], counts[3], elapsed, remaining, AUTO_CAP)
        if raised is not None:
            share, steps = raised, steps + 1
    raise AssertionError("unreachable: the last look ends the window")


def few_users_case(users: int, canary_ratio: float, windows: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    runs = [few_users_window(users, canary_ratio, rng) for _ in range(windows)]
    outcomes = [o for o, _, _ in runs]
    return {
        "users": users,
        "requests_per_10_min": users * REQUESTS_PER_USER,
        "canary_error_ratio": canary_ratio,
        "windows": windows,
        "ready": outcomes.count("ready") / windows,
        "rolled_back": proportion(outcomes.count("rolled_back"), windows),
        "undecided": proportion(outcomes.count("undecided"), windows),
        "median_final_share": statistics.median(s for _, s, _ in runs),
        "median_ramp_steps": statistics.median(n for _, _, n in runs),
    }


def _commit() -> str | None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False)
    return done.stdout.strip() or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", type=int, default=1000)
    parser.add_argument("--peer-windows", type=int, default=200)
    parser.add_argument("--worse-windows", type=int, default=200)
    parser.add_argument("--user-windows", type=int, default=200)
    parser.add_argument("--unit-windows", type=int, default=100)
    parser.add_argument("--latency-windows", type=int, default=200)
    parser.add_argument("--live-latency-windows", type=int, default=50)
    parser.add_argument("--seed", type=int, default=39)
    parser.add_argument("--smoke", action="store_true", help="a few windows of a few cases: it runs, nothing more")
    parser.add_argument("--units-only", action="store_true", help="only the users-as-units rows (more windows, sooner)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    traffic, rates = (60, 600, 6000), (0.002, 0.01, 0.03)
    if args.smoke:
        args.windows, args.peer_windows, args.worse_windows, traffic, rates = 5, 3, 5, (600,), (0.01,)
        args.user_windows, args.latency_windows, args.live_latency_windows, args.unit_windows = 3, 2, 1, 2
    started = time.monotonic()
    units = users_rows(args.unit_windows, LOOKS, FALSE_ROLLBACK, args.seed + 17, smoke=args.smoke)
    if args.units_only:
        return _print({"benchmark": "verdict", **_run(), "users_as_units": units}, started, args.out)
    null = [null_case(Case(t, r, r), args.windows, args.peer_windows, args.seed) for t in traffic for r in rates]
    null += [null_case(Case(t, 0.01, 0.01, burst=True), args.windows, args.peer_windows, args.seed) for t in traffic]
    worse = [
        worse_case(Case(t, 0.01, 0.01 * ratio), args.worse_windows, args.seed + 7) for t in traffic for ratio in (2, 3)
    ]
    few = [
        few_users_case(users, ratio, args.user_windows, args.seed + 11)
        for users in ((20,) if args.smoke else (5, 20, 200, 2000))
        for ratio in (1.0, 2.0)
    ]
    result = {
        "benchmark": "verdict",
        **_run(),
        "window": {"looks": LOOKS, "every_s": LOOK_S, "share": SHARE},
        "false_rollback_budget": FALSE_ROLLBACK,
        "live_error_rule_alpha": rule_alpha(FALSE_ROLLBACK),
        "peer": f"Fisher one-sided on the cumulative counts at every look, p < {PEER_ALPHA}",
        "as_good_as_production": null,
        "worse": worse,
        "few_users": few,
        "users_as_units": units,
        **latency_rows(args.latency_windows, args.live_latency_windows, args.seed + 13, smoke=args.smoke),
    }
    return _print(result, started, args.out)


def _run() -> dict[str, Any]:
    """Which code ran, when, where."""
    return {
        "commit": _commit(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.node()} ({platform.machine()}, {platform.python_version()})",
    }


def _print(result: dict[str, Any], started: float, out: Path | None) -> int:
    text = json.dumps({**result, "seconds": round(time.monotonic() - started, 1)}, indent=1)
    if out:
        out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
