"""The residency guard and the pins on a real vLLM replica, through ``bench/residency.py
--smoke`` (its replica is the one these tests need: started once for both, and the smoke
then runs in ``make test`` as every benchmark's does).

The smoke's replica holds 4 adapters for 8 in production, 2 of them pinned, with no minimum
residency and the default cap of 5 evictions a minute; a Zipf workload of 60 requests goes
through the live split in well under a minute. A pinned adapter is never read from disk again
after its first answer whatever the others do, and once the cap is spent the base answers,
saying so in ``x-loragate-fallback``, while no request fails.
"""

from __future__ import annotations

import pytest

from tests.test_bench_smoke import run_bench

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke(tiny_base, support_bundle) -> dict:
    result = run_bench("bench.residency", "--smoke", f"--base={tiny_base}", f"--bundle={support_bundle}")
    return result["ways"]["today_pinned_guarded"]


def test_pinned_adapters_survive_an_eviction_storm_without_a_cold_load(smoke):
    assert smoke["pinned"] and smoke["evictions"] >= 1, smoke
    assert smoke["pinned_cold_loads_after_the_first"] == 0, smoke


def test_a_replica_over_its_eviction_cap_answers_from_the_base_with_the_fallback_header(smoke):
    cap = smoke["guard"]["evictions_per_minute"]
    assert smoke["evictions_last_minute"] <= cap and smoke["evictions"] <= cap, smoke
    assert smoke["answered_by_base"] >= 1 and smoke["failed"] == 0, smoke
    assert smoke["fallback_reasons"] == ["production_residency:eviction_cap"], smoke


def test_the_residency_benchmark_reports_every_figure_its_page_reads(smoke):
    assert smoke["hit_rate"] is not None and 0 < smoke["hit_rate"] <= 1
    assert smoke["ttft_p95_ms"]["warm"] is not None and smoke["cold_load_ms"]["p50"] is not None
