"""Every benchmark still runs, in its smallest mode: a benchmark that breaks fails CI.

No figure is asserted (that is what the benchmarks' own targets and docs/benchmarks/ are
for); only that each finishes, prints its JSON, and its result has the shape those pages read.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def run_bench(module: str, *argv: str, timeout: int = 600) -> dict:
    """``python -m <module> *argv`` from the repository root, as the benchmarks run."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *argv], cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def secrets_of(directory: Path) -> dict[str, str]:
    return {f.name: f.read_text() for f in sorted(directory.iterdir()) if f.is_file()}


def test_registry_benchmark_runs_in_smoke_mode(tmp_path):
    result = run_bench("bench.registry", "--scale", "smoke", "--peers", "auto", "--out", str(tmp_path / "r.json"))
    assert set(result["loragate"]) == {"postgres", "sqlite"}
    for backend in ("postgres", "sqlite"):
        assert {"resolve_p99_ms", "pointer_move_p99_ms"} <= set(result["verdict"][backend])
    assert result["naive_files"]


def test_command_start_up_benchmark_runs_against_a_worktree_of_head(tmp_path):
    result = run_bench("bench.cli_start", "--runs", "1", "--against", "HEAD", "--out", str(tmp_path / "c.json"))
    assert set(result["commands"]) == {"help", "rollback_help", "json_list"}
    assert all(c["before"]["n"] == c["after"]["n"] == 1 for c in result["commands"].values())


def test_verdict_benchmark_runs_in_smoke_mode():
    result = run_bench("bench.verdict", "--smoke")
    assert result["live_error_rule_alpha"] == 0.0025
    for case in result["as_good_as_production"]:
        assert case["loragate"]["windows"] == 5 and case["fisher_every_look"]["windows"] == 3
    assert all(case["caught"]["windows"] == 5 for case in result["worse"])
    assert [(c["users"], c["windows"]) for c in result["few_users"]] == [(20, 3), (20, 3)]
    assert [(c["factor"], c["windows"]) for c in result["probe_latency"]] == [(1.0, 2), (1.5, 2)]
    assert [(c["factor"], c["windows"]) for c in result["live_latency"]] == [(1.0, 1), (1.5, 1)]


def test_validation_benchmark_runs_in_smoke_mode():
    result = run_bench("bench.validation", "--smoke")
    assert [r["adapters"] for r in result["results"]] == [2, 3]
    assert all(r["naive_s"] > 0 and r["batched_s"] > 0 for r in result["results"])
    quality = result["gate_quality"]
    assert set(quality["added_per_adapter_ms"]) == {"scan", "regression"}
    assert quality["inside_the_reports_ms_mean"]["regression_s"] > 0 and quality["scan_verdicts"]


def test_fleet_benchmark_runs_in_smoke_mode_on_the_session_replicas_and_gives_them_back(
    replicas, replica_adapters, tiny_base
):
    urls = [replicas["prod-a"].url, replicas["prod-b"].url]
    argv = [f"--replica={url}" for url in urls]
    secrets = str(replicas["prod-a"].secrets_dir)  # the replicas obey only the fleet: their key, registry
    before = secrets_of(replicas["prod-a"].secrets_dir)
    result = run_bench(
        "bench.fleet",
        "--smoke",
        *argv,
        "--adapter-dir",
        str(replica_adapters),
        "--base",
        str(tiny_base),
        "--replica-secrets",
        secrets,
    )
    assert set(result["rollback"]) == {"1", "2"}
    assert {"switch_flat_in_n", "zero_failed_requests", "after_switch_within_10pct"} <= set(result["verdict"])
    assert result["latency"]["whole_switching_run"]["n"] > 0
    under_load = result["under_load"]
    assert under_load["rollback"]["n"] == 1 and under_load["traffic"]["n"] > 0
    assert set(under_load["phases"]) == {
        "copies_before_lock",
        "fleet_switch_under_lock",
        "index_write",
        "per_replica_move",
        "per_replica_switch",
        "per_replica_golden_completions",
    }
    assert under_load["phases"]["per_replica_golden_completions"]["n"] == 2  # a rollback verifies both replicas
    # pointed back at the registry they read before, not at the run's, which is gone
    assert secrets_of(replicas["prod-a"].secrets_dir) == before


def test_copies_benchmark_runs_in_smoke_mode(tmp_path):
    result = run_bench("bench.copies", "--smoke", "--out", str(tmp_path / "c.json"))
    fleet = result["fleet_status_copies"]
    assert fleet["adapters"] == 5 and fleet["cold"]["files_read"] == 15
    assert fleet["clean"]["files_read"] == 0 and fleet["after_one_change"]["files_read"] == 1
    assert fleet["damaged_found"] == 0
    assert {"first_lookup", "repeat_lookup", "unverified_lookup"} <= set(result["resolver"]["big"])


def test_evaluate_benchmark_runs_in_smoke_mode_on_a_session_replica_and_gives_it_back(
    tmp_path, replicas, replica_adapters, tiny_base, support_bundle, retrained_support_bundle
):
    before = secrets_of(replicas["prod-a"].secrets_dir)
    argv = [
        f"--production={replicas['prod-a'].url}",
        f"--adapter-dir={replica_adapters}",
        f"--replica-secrets={replicas['prod-a'].secrets_dir}",
        f"--base={tiny_base}",
        "--bundles",
        str(support_bundle),
        str(retrained_support_bundle),
    ]
    result = run_bench("bench.evaluate", "--smoke", *argv, "--out", str(tmp_path / "e.json"))
    assert result["open_windows"] == 2
    runs = result["ways"]["defaults"]["runs"]
    assert [r["state"] for r in runs] == ["Completed", "Completed"]
    assert all(r["observed"] + r["left_for_the_next_run"] == 2 for r in runs)
    assert secrets_of(replicas["prod-a"].secrets_dir) == before


def test_scale_benchmark_runs_in_smoke_mode_on_the_session_replicas_and_gives_them_back(
    tmp_path, replicas, replica_adapters, tiny_base, support_bundle
):
    before = secrets_of(replicas["prod-a"].secrets_dir)
    argv = [
        f"--production={replicas['prod-a'].url}",
        f"--canary={replicas['canary'].url}",
        f"--adapter-dir={replica_adapters}",
        f"--base={tiny_base}",
        f"--bundle={support_bundle}",
        f"--replica-secrets={replicas['prod-a'].secrets_dir}",
    ]
    result = run_bench("bench.scale", "--smoke", *argv, "--out", str(tmp_path / "s.json"), timeout=900)
    burst = result["burst"]["large"]
    assert burst["event_to_canary_serving"]["n"] == 2
    # the two tenants and the slow control (the same adapter answered 3x as slowly)
    assert burst["evaluate"]["windows"] == 3 and burst["evaluate"]["requests_per_observation"] > 0
    # what the verdicts were is the benchmark's figure, not this test's: one promote run waits
    # per window that became ready, whichever they were
    summary, control = burst["verdicts"]["summary"], burst["verdicts"]["slow_control"]
    assert summary["good_tenants"] == 2 and "status" in control
    ready = summary["good_states"].get("ready", 0) + (control["status"] == "ready")
    assert burst["sign_off"]["promote_runs"] == ready and burst["sign_off"]["processes_held"] == 0
    assert set(burst["flow_runs"]) >= {"register", "shadow-validate", "canary", "canary-evaluate", "promote"}
    # a suspended promote run has not ended: it queued, and has no run time yet
    assert burst["flow_runs"]["canary"]["ran_s"] and burst["flow_runs"]["promote"]["queued_s"]
    assert result["restart"]["2"]["answering"] == 2 and result["restart"]["2"]["fleet_in_sync"]
    assert secrets_of(replicas["prod-a"].secrets_dir) == before


def test_traffic_benchmark_runs_in_smoke_mode_on_the_session_replicas_and_gives_them_back(
    tmp_path, replicas, replica_adapters, tiny_base, support_bundle, tickets_bundle
):
    before = secrets_of(replicas["prod-a"].secrets_dir)
    argv = [
        f"--replica={replicas['prod-a'].url}",
        f"--replica={replicas['prod-b'].url}",
        f"--adapter-dir={replica_adapters}",
        f"--base={tiny_base}",
        f"--replica-secrets={replicas['prod-a'].secrets_dir}",
        "--bundles",
        str(support_bundle),
        str(tickets_bundle),
    ]
    result = run_bench("bench.traffic", "--smoke", *argv, "--out", str(tmp_path / "t.json"))
    assert {"commit", "date", "machine", "targets"} <= set(result)
    assert set(result["split"]) == {"0.01", "0.1", "0.5"}
    for row in result["split"].values():
        assert row["users"] > 0 and len(row["wilson_99"]) == 2
        assert row["stickiness"]["across_replicas"]["users"] > 0
    assert result["cost"]["on"]["n"] > 0 and result["cost"]["off"]["n"] > 0 and result["cost"]["peer"]
    assert result["withdraw"]["rounds"] and {"routing", "reload"} <= set(result["rollback"])
    assert all(isinstance(t["met"], bool) or t["met"] is None for t in result["targets"].values())
    assert secrets_of(replicas["prod-a"].secrets_dir) == before


def test_stall_benchmark_runs_in_smoke_mode_on_a_session_replica_and_gives_it_back(
    replicas, replica_adapters, tiny_base, support_bundle
):
    before = secrets_of(replicas["prod-a"].secrets_dir)
    argv = [
        f"--production={replicas['prod-a'].url}",
        f"--adapter-dir={replica_adapters}",
        f"--replica-secrets={replicas['prod-a'].secrets_dir}",
        f"--base={tiny_base}",
        f"--bundle={support_bundle}",
    ]
    result = run_bench("bench.stall", "--smoke", *argv)
    assert secrets_of(replicas["prod-a"].secrets_dir) == before
    assert result["adapters"] == 4 and result["traffic"]["requests"] == 8
    assert {"filtered_read", "unfiltered_read", "read_live_figures"} <= set(result["figures"])
    conditions = result["conditions"]
    assert set(conditions) == {"none", "filtered", "unfiltered"}
    assert set(result["p99_ratio"]) == {"filtered", "unfiltered"}
    assert all(c["gaps"]["n"] > 0 for c in conditions.values())
    assert all(conditions[c]["reads"]["n"] > 0 for c in ("filtered", "unfiltered"))
