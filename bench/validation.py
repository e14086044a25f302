"""Batched shadow validation against the naive way, on the same adapters in one run.

naive:   per adapter, a fresh base (digest check + load) and PEFT's from_pretrained,
         then the same checks (this is ``validate_group`` called with one adapter).
batched: one base load per base, adapters attached and detached in turn
         (``validate_group`` with all adapters).

Both run the identical gate (same checks, same golden set, greedy decoding), so the
difference is pure overhead. For batched validation the per-adapter overhead is
reported against the bare forward-pass time of the golden set (the greedy generation
with the adapter attached, ``timing.forward_s`` in each report).

Gate quality, on a 16-layer base (16 modules per family: the least adaptersentry compares
within), batched, the same adapters three ways in one run, interleaved and repeated:
the gate without the weight scan and without a production to compare with; with the
scan; with the scan and, per adapter, a production version of its own run on the same
golden set in the same session (the regression check's cost when every tenant has one).

    .venv/bin/python -m bench.validation [--sizes 20 50] [--quick | --smoke]

The trained adapters are checked on their golden set before any variant is derived from
them (a seed whose training does not converge is skipped and listed in the output), so
every adapter the benchmark times is known to pass the gate.

Prints JSON on stdout; progress on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from kit.basekit import build_base
from kit.corpus import copy_bundle, edit_tensors
from kit.modelkit import train_adapter
from kit.tenant_tasks import golden_set
from loragate.registry.intake.catalog import inspect_base
from loragate.registry.records.reports import ValidationReport
from loragate.registry.settings import Settings
from loragate.tasks.validation import AdapterUnderTest, ValidationPolicy, validate_bundle, validate_group
from loragate.tasks.validation.checks import Baseline

SPEEDUP_TARGET = 3.0
# seeds tried per trained adapter wanted before giving up
MAX_SEED_TRIES = 3
OVERHEAD_TARGET = 0.25


def log(msg: str) -> None:
    print(f"[bench/validation] {msg}", file=sys.stderr, flush=True)


def train_passing(base: Path, root: Path, golden, record, policy, wanted: int) -> tuple[list[Path], list[dict]]:
    """``wanted`` trained adapters that pass their golden set, checked before anything is
    derived from them: a seed whose training does not converge is skipped and reported."""
    trained, skipped = [], []
    for seed in range(wanted * MAX_SEED_TRIES):
        if len(trained) == wanted:
            break
        bundle = train_adapter(base, "support", root / f"trained-{seed}", seed=seed, steps=300)
        report = validate_bundle(record, bundle, golden, policy)
        if report.passed:
            trained.append(bundle)
        else:
            loss = json.loads((bundle / "manifest.json").read_text())["training_metadata"]["final_loss"]
            skipped.append({"seed": seed, "final_loss": loss, "failures": report.failures})
            log(f"seed {seed} did not converge (loss {loss}): {report.summary}; trying the next one")
    if len(trained) < wanted:
        raise SystemExit(f"only {len(trained)} of {wanted} trained adapters pass the gate: {skipped}")
    return trained, skipped


def make_adapters(trained: list[Path], root: Path, count: int) -> list[Path]:
    """The known-good trained adapters, and distinct variants of them (weights nudged by
    1e-4 relative noise) up to ``count``: every one passes its golden set."""
    import torch

    bundles = []
    for i in range(count):
        src = trained[i % len(trained)]
        if i < len(trained):
            bundles.append(src)
            continue
        dest = copy_bundle(src, root / f"variant-{i}")
        gen = torch.Generator().manual_seed(i)
        edit_tensors(
            dest,
            lambda sd, gen=gen: {k: v * (1 + 1e-4 * torch.randn(v.shape, generator=gen)) for k, v in sd.items()},
        )
        bundles.append(dest)
    return bundles


def targets_for(bundles: list[Path], golden) -> list[AdapterUnderTest]:
    return [
        AdapterUnderTest(
            name=f"bench/tiny-llama/a{i}",
            bundle_dir=b,
            manifest=json.loads((b / "manifest.json").read_text()),
            golden=golden,
        )
        for i, b in enumerate(bundles)
    ]


def run_naive(record, targets, policy) -> tuple[float, list[dict]]:
    reports = []
    t0 = time.perf_counter()
    for t in targets:
        reports.extend(validate_group(record, None, [t], policy))
    return time.perf_counter() - t0, reports


def run_batched(record, targets, policy) -> tuple[float, list[dict]]:
    t0 = time.perf_counter()
    reports = validate_group(record, None, targets, policy)
    return time.perf_counter() - t0, reports


def summarize(
    n: int, naive_s: float, naive: list[ValidationReport], batched_s: float, batched: list[ValidationReport]
) -> dict:
    forward = [r.timing["forward_s"] for r in batched]
    per_adapter = batched_s / n
    mean_forward = statistics.fmean(forward)
    overhead = per_adapter - mean_forward
    failing = [(r.name, r.failures) for r in naive + batched if not r.passed]
    if failing:
        raise SystemExit(f"every bench adapter must pass the gate; these did not: {failing[:3]}")
    if [r.output_sha256 for r in naive] != [r.output_sha256 for r in batched]:
        raise SystemExit("naive and batched validation disagree on the outputs")
    return {
        "adapters": n,
        "naive_s": round(naive_s, 3),
        "batched_s": round(batched_s, 3),
        "speedup": round(naive_s / batched_s, 2),
        "naive_per_adapter_ms": round(1000 * naive_s / n, 1),
        "batched_per_adapter_ms": round(1000 * per_adapter, 1),
        "forward_pass_ms_mean": round(1000 * mean_forward, 1),
        "overhead_per_adapter_ms": round(1000 * overhead, 1),
        "overhead_fraction_of_forward": round(overhead / mean_forward, 3),
        "batched_breakdown_ms_mean": {
            k: round(1000 * statistics.fmean(r.timing.get(k, 0.0) for r in batched), 2)
            for k in ("load_s", "scan_s", "forward_s", "total_s")
        },
        "speedup_target_met": naive_s / batched_s >= SPEEDUP_TARGET,
        "overhead_target_met": overhead / mean_forward < OVERHEAD_TARGET,
    }


def gate_quality_cost(root: Path, n: int, repeats: int, steps: int) -> dict:
    """Added time per adapter of the weight scan and of the regression run, against the
    gate without them, on the same adapters in one run."""
    base = build_base(root / "deep-llama", num_layers=16)
    record = inspect_base(str(base), "deep-llama")
    golden = golden_set("support")
    trained = train_adapter(base, "support", root / "deep-trained", steps=steps, base_model_id="deep-llama")
    bundles = make_adapters([trained], root / "deep-variants", 2 * n + 1)[1:]
    candidates, productions = bundles[:n], bundles[n:]
    policy = ValidationPolicy.from_settings(Settings())
    configs = {
        "gate": (dataclasses.replace(policy, scan_weights=False), False),
        "gate_scan": (policy, False),
        "gate_scan_regression": (policy, True),
    }

    def targets(with_production: bool) -> list[AdapterUnderTest]:
        ts = targets_for(candidates, golden)
        if with_production:
            for i, (t, prod) in enumerate(zip(ts, productions, strict=True)):
                t.production = Baseline(f"production-{i}", bundle_dir=prod)
        return ts

    validate_group(record, None, targets(True)[:2], policy)  # warm-up
    times: dict[str, list[float]] = {k: [] for k in configs}
    reports: dict[str, list[ValidationReport]] = {}
    for r in range(repeats):
        for name, (config, with_production) in configs.items():
            t0 = time.perf_counter()
            reports[name] = validate_group(record, None, targets(with_production), config)
            times[name].append(time.perf_counter() - t0)
        log(f"gate quality, repeat {r + 1}/{repeats}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()))
    per_adapter = {k: statistics.median(v) / n for k, v in times.items()}
    forward = statistics.fmean(rep.timing["forward_s"] for rep in reports["gate"])
    added = {
        "scan": per_adapter["gate_scan"] - per_adapter["gate"],
        "regression": per_adapter["gate_scan_regression"] - per_adapter["gate_scan"],
    }
    full = reports["gate_scan_regression"]
    return {
        "model": "tiny Llama (hidden 128, 16 layers), LoRA r=8 on 7 modules (112 modules, 16 per family)",
        "adapters": n,
        "repeats": repeats,
        "training_steps": steps,
        "per_adapter_ms_median": {k: round(1000 * v, 1) for k, v in per_adapter.items()},
        "added_per_adapter_ms": {k: round(1000 * v, 1) for k, v in added.items()},
        "added_fraction_of_gate": {k: round(v / per_adapter["gate"], 3) for k, v in added.items()},
        "forward_pass_ms_mean": round(1000 * forward, 1),
        "inside_the_reports_ms_mean": {
            "scan_s": round(1000 * statistics.fmean(rep.timing.get("scan_s", 0.0) for rep in full), 1),
            "regression_s": round(1000 * statistics.fmean(rep.timing.get("regression_s", 0.0) for rep in full), 1),
        },
        "scan_verdicts": dict(sorted(Counter(rep.scan.action for rep in full if rep.scan).items())),
        "regressed": sum(bool(rep.regression and rep.regression.regressed) for rep in full),
        "golden_passed": sum(rep.checks["golden"].ok for rep in full if "golden" in rep.checks),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20, 50])
    parser.add_argument("--quick", action="store_true", help="sizes 4 and 8")
    parser.add_argument("--smoke", action="store_true", help="sizes 2 and 3: does it still run (make test)")
    parser.add_argument("--quality-adapters", type=int, default=20, help="adapters in the gate-quality section")
    args = parser.parse_args()
    sizes = [2, 3] if args.smoke else [4, 8] if args.quick else args.sizes
    quality_n, quality_repeats = (2, 1) if args.smoke else (4, 1) if args.quick else (args.quality_adapters, 3)

    import torch

    with tempfile.TemporaryDirectory(prefix="loragate-bench-validation-") as tmp:
        root = Path(tmp)
        log("building the tiny base and training adapters")
        base = build_base(root / "tiny-llama")
        record = inspect_base(str(base), "tiny-llama")
        golden = golden_set("support")
        policy = ValidationPolicy.from_settings(Settings())
        # the smoke derives its variants from one trained adapter: each training is ~15 s of CI
        wanted = 1 if args.smoke else min(5, max(sizes))
        trained, skipped = train_passing(base, root / "trained", golden, record, policy, wanted=wanted)
        bundles = make_adapters(trained, root / "adapters", max(sizes))
        # warm-up: imports, kernels and allocator, outside every timed region
        validate_group(record, None, targets_for(bundles[:2], golden), policy)

        results = []
        for n in sizes:
            targets = targets_for(bundles[:n], golden)
            log(f"{n} adapters: naive")
            naive_s, naive = run_naive(record, targets, policy)
            log(f"{n} adapters: batched")
            batched_s, batched = run_batched(record, targets, policy)
            results.append(summarize(n, naive_s, naive, batched_s, batched))
            log(f"{n} adapters: naive {naive_s:.2f}s, batched {batched_s:.2f}s, x{naive_s / batched_s:.1f}")
        log(f"gate quality: {quality_n} adapters on a 16-layer base")
        quality = gate_quality_cost(root, quality_n, quality_repeats, steps=30 if args.smoke else 150)

    print(
        json.dumps(
            {
                "benchmark": "shadow validation: batched vs naive",
                "machine": {
                    "cpu_count": os.cpu_count(),
                    "python": platform.python_version(),
                    "torch": torch.__version__,
                    "threads": torch.get_num_threads(),
                },
                "model": "tiny Llama (hidden 128, 2 layers), LoRA r=8 on 7 modules, "
                "golden set of 8 cases, max 32 new tokens",
                "targets": {"speedup_at_50": SPEEDUP_TARGET, "overhead_fraction_of_forward": OVERHEAD_TARGET},
                "trained_adapters": len(trained),
                "seeds_skipped_for_not_passing": skipped,
                "results": results,
                "gate_quality": quality,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
