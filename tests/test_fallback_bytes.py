"""Every answer is produced by the bytes its label names -- its version's, or the base's --
on a real vLLM replica short of memory, through ``bench/fallback_bytes.py --smoke`` (its own
replica: 2 slots and 4 cache entries for 8 adapters of two behaviours trained to distinct
answers, the guard's eviction cap, 1,200 requests from 8 clients cycling Zipf-drawn names, a
quarter naming the base itself, while one more client holds a long answer of the hottest
adapter so that every batch mixes the base's rows with an adapter's).

Before the plugin kept adapters' deltas off the base's rows (``cpu_lora_ops``), the same
smoke gave 419 answers of 1,200 that were not their label's, 368 of them labelled the base
and carrying an adapter's text.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from loragate.local.replica_config import DEFAULT_PYTHON
from tests.test_bench_smoke import ROOT, run_bench

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke(tiny_base, support_bundle, tickets_bundle) -> dict:
    result = run_bench(
        "bench.fallback_bytes", "--smoke", f"--base={tiny_base}", "--bundles", str(support_bundle), str(tickets_bundle)
    )
    return result["ways"]["guarded"]


def test_every_answer_is_its_labels_bytes_with_refused_and_admitted_requests_in_the_same_batches(smoke):
    assert smoke["requests"] == 1200 and smoke["failed"] == 0, smoke
    # both kinds of answer, in the same run: versions admitted, the guard's refusals answered by the base
    assert smoke["answered_by_versions"] >= 100 and smoke["fallbacks"] >= 1, smoke
    assert smoke["fallback_reasons"] == ["production_residency:eviction_cap"], smoke
    assert smoke["held_answers"] >= 1, smoke
    assert smoke["mismatched"] == 0 and smoke["base_labelled_with_an_adapters_text"] == 0, smoke


def test_the_replica_says_its_base_rows_are_guarded_and_its_base_probe_agrees_under_load(smoke):
    assert smoke["replica"]["base_rows_guarded"] is True, smoke
    probe = smoke["replica"]["base_probe"]
    assert probe["reference_taken"] and probe["checked"] >= 1 and probe["mismatched"] == 0, probe


def test_the_ops_benchmark_times_vllms_ops_and_the_plugins_in_the_replicas_venv():
    proc = subprocess.run(
        [str(DEFAULT_PYTHON), "-m", "bench.cpu_lora_ops", "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    shapes = json.loads(proc.stdout)["shapes"]
    assert len(shapes) == 2 and all(s["vllm_us"] > 0 and s["guarded_us"] > 0 for s in shapes), shapes
