"""How long a ``loragate`` command takes to start, against an earlier revision in the same run.

Run from the repository root::

    .venv/bin/python -m bench.cli_start                 # 10 runs of each command on each side
    .venv/bin/python -m bench.cli_start --runs 5 --against HEAD~3
    .venv/bin/python -m bench.cli_start --runs 5 --fleet-runs 5 --against f10ecdd

Each command is a fresh process, ``python -m loragate.cli.main ...`` in the code's root with
``PYTHONPATH`` set to it, in this same Python environment:

* ``--help``: the top-level help (target: 0.3 s or less);
* ``rollback --help``: a subcommand's help;
* ``--json list``: a real read-only command against a fresh SQLite registry (a temporary
  ``LORAGATE_HOME`` that side's own ``loragate init`` created), which does import the store;
* with ``--fleet-runs N``: ``rollback NAME`` on an idle fleet of two vLLM replicas, the
  command doing its real work end to end (``bench/cli_rollback.py``).

The other side is the code at ``--against REF`` (default: the parent of the commit that
added this file, the last revision whose parser imported every command's dependencies at
startup; ``HEAD`` while this file is not committed), checked out in a temporary
``git worktree``. Runs alternate sides (ABBA) after one untimed warm-up each (the worktree
has no bytecode cache yet). Reported per command and side: the median and p90 (nearest
rank) wall time in seconds, and this tree's over REF's. The JSON goes to stdout and to
``bench/out/cli-start.json``; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.cli_rollback import bench_fleet_rollback, cli_module, run_command

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
OUT = BENCH / "out"

COMMANDS = {
    "help": ["--help"],
    "rollback_help": ["rollback", "--help"],
    "json_list": ["--json", "list"],
}
HELP_TARGET_S = 0.3
COMMAND_TARGET_S = 1.0


def log(msg: str) -> None:
    print(f"[cli_start] {msg}", file=sys.stderr, flush=True)


def git(*argv: str) -> str:
    return subprocess.run(["git", *argv], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def default_against() -> str:
    """The parent of the commit that added this benchmark; HEAD before it is committed."""
    added = git("log", "--diff-filter=A", "--format=%H", "--", "bench/cli_start.py").splitlines()
    return f"{added[-1]}^" if added else "HEAD"


def side_env(code: Path, home: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(code), "LORAGATE_HOME": str(home), "LORAGATE_ACTOR": "bench"}
    for name in ("LORAGATE_DATABASE_URL", "LORAGATE_ARTIFACTS", "LORAGATE_TOKEN", "LORAGATE_PROGRESS"):
        env.pop(name, None)
    return env


def code_root_of(code: Path, env: dict[str, str]) -> str:
    """Where the CLI is imported from on that side (the editable install must not win)."""
    module = cli_module(code)
    depth = module.count(".")
    probe = f"import {module} as m, pathlib; print(pathlib.Path(m.__file__).resolve().parents[{depth}])"
    return subprocess.run(
        [sys.executable, "-c", probe], cwd=code, env=env, check=True, capture_output=True, text=True
    ).stdout.strip()


def summary(samples: list[float]) -> dict[str, float | int]:
    ordered = sorted(samples)
    p90 = ordered[min(len(ordered) - 1, max(0, math.ceil(0.9 * len(ordered)) - 1))]
    return {"n": len(ordered), "median_s": round(statistics.median(ordered), 4), "p90_s": round(p90, 4)}


def bench(against: str, runs: int, fleet_runs: int = 0) -> dict:
    commit = git("rev-parse", "--verify", f"{against}^{{commit}}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="loragate-bench-cli-start-") as tmp:
        worktree = Path(tmp) / "before"
        git("worktree", "add", "--detach", str(worktree), commit)
        try:
            sides = {"before": worktree, "after": ROOT}
            envs = {side: side_env(code, Path(tmp) / f"home-{side}") for side, code in sides.items()}
            roots = {side: code_root_of(code, envs[side]) for side, code in sides.items()}
            for side, code in sides.items():
                if roots[side] != str(code.resolve()):
                    raise SystemExit(f"{side}: {cli_module(code)} imported from {roots[side]}, not {code}")
                log(f"{side}: loragate init in a fresh SQLite registry; one warm-up of each command")
                run_command(code, envs[side], ["init"])
                for argv in COMMANDS.values():
                    run_command(code, envs[side], argv)
            samples: dict[str, dict[str, list[float]]] = {s: {c: [] for c in COMMANDS} for s in sides}
            order = list(sides)
            for i in range(runs):
                log(f"run {i + 1}/{runs}")
                for side in order if i % 2 == 0 else reversed(order):  # ABBA: neither side always first
                    for name, argv in COMMANDS.items():
                        samples[side][name].append(run_command(sides[side], envs[side], argv))
            if fleet_runs:
                rollbacks = bench_fleet_rollback(sides, fleet_runs, Path(tmp) / "fleet")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False)
    figures = {}
    for name in COMMANDS:
        before, after = summary(samples["before"][name]), summary(samples["after"][name])
        target = HELP_TARGET_S if name.endswith("help") else COMMAND_TARGET_S
        figures[name] = {
            "argv": COMMANDS[name],
            "before": before,
            "after": after,
            "after_over_before": {
                k: round(after[k] / before[k], 3) if before[k] else None for k in ("median_s", "p90_s")
            },
            "target_s": target,
            "after_median_within_target": after["median_s"] <= target,
        }
    if fleet_runs:
        before, after = summary(rollbacks["before"]), summary(rollbacks["after"])
        figures["rollback_idle_2_replicas"] = {
            "argv": ["rollback", "NAME", "--json"],
            "before": before,
            "after": after,
            "after_over_before": {
                k: round(after[k] / before[k], 3) if before[k] else None for k in ("median_s", "p90_s")
            },
        }
    return {
        "benchmark": "loragate command start-up: this tree against an earlier revision, fresh processes",
        "against": commit,
        "this_tree": git("rev-parse", "HEAD") + (" (with uncommitted changes)" if git("status", "--porcelain") else ""),
        "runs": runs,
        "commands": figures,
        "environment": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        },
        "wall_s": round(time.perf_counter() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="Start-up time of loragate commands against an earlier revision.")
    parser.add_argument("--runs", type=int, default=10, help="timed runs of each command on each side (default 10)")
    parser.add_argument(
        "--against",
        metavar="REF",
        help="the git revision to compare with (default: the parent of the commit that added this benchmark)",
    )
    parser.add_argument(
        "--fleet-runs",
        type=int,
        default=0,
        help="also time `loragate rollback` on an idle fleet of 2 vLLM replicas, this many runs a side",
    )
    parser.add_argument("--out", type=Path, default=OUT / "cli-start.json", help="where the JSON goes too")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    result = bench(args.against or default_against(), args.runs, args.fleet_runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    log(f"done in {result['wall_s']}s; written to {args.out}")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
