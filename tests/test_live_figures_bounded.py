"""A production replica's live figures stay bounded however many canary windows pass, on a
session's real vLLM replica: each window's answers are kept under the window's id, and once
windows have ended the replica keeps at most the plugin's cap of their entries
(``live_stats.ENDED_WINDOWS_KEPT``) beside the active window's, counting what it dropped --
the per-version figures a replica serves for the fleet's reads do not grow with the windows.
"""

from __future__ import annotations

import httpx
import pytest

from loragate.registry.rules.canary import WindowStatus
from loragate.tasks.canary_moves import deploy_canary
from tests.support.fleet import SUPPORT_PROMPT, admin_client, make_fleet

pytestmark = pytest.mark.slow

WINDOWS = 1000
# the plugin's cap on ended windows' entries (infra/vllm_plugin/loragate_resolver/live_stats.py)
ENDED_WINDOWS_KEPT = 64


@pytest.fixture
def canary(tmp_path, replicas, replica_adapters, validated_adapters):
    """v1 in production, v2 the canary warm on every production replica at a 50 % share."""
    fleet = make_fleet(tmp_path, replicas, replica_adapters, validated_adapters, canary_share=0.5)
    fleet.promote(fleet.v1, "canary")
    fleet.promote(fleet.v1, "production")
    deployment = deploy_canary(fleet.registry, fleet.v2)
    yield fleet, deployment.window
    fleet.registry.close()


def kept(figures: dict) -> tuple[int, int, list]:
    """(entries held, ended-window entries dropped so far: the replica's, all adapters; the
    windows of this adapter's entries, one per entry)."""
    return (
        figures["kept"]["entries"],
        figures["kept"]["ended_windows_dropped"],
        [v["window"] for v in figures["versions"]],
    )


def test_a_replicas_figures_stay_bounded_after_1000_windows_and_keep_the_active_one(canary):
    fleet, window = canary
    replica = next(r for r in fleet.replicas.values() if r.role == "production")
    with admin_client(fleet.registry, replica.url) as client, httpx.Client(base_url=replica.url, timeout=60) as users:
        entries_before, dropped_before, _ = kept(client.traffic([fleet.name]))
        most = most_own = 0
        for n in range(WINDOWS):
            if n:
                fleet.registry.close_canary_window(window.id, WindowStatus.ROLLED_BACK, "the next window")
                window, created = fleet.registry.open_canary_window(fleet.v2, 0.5)
                assert created
                client.refresh_routes()
            body = {"model": fleet.name, "prompt": SUPPORT_PROMPT, "max_tokens": 1, "user": f"user-{n}"}
            answered = users.post("/v1/completions", json=body)
            assert answered.status_code == 200, answered.text
            if n % 100 == 99 or n == WINDOWS - 1:
                entries, dropped, windows = kept(client.traffic([fleet.name]))
                most, most_own = max(most, entries), max(most_own, len(windows))
                assert window.id in windows  # the active window's answers are always there

    # the active window's sides on top of the cap; the replica is shared, so other tests'
    # entries held before are counted in its total
    assert most_own <= ENDED_WINDOWS_KEPT + 2, most_own
    assert most <= entries_before + ENDED_WINDOWS_KEPT + 2, (most, entries_before)
    assert dropped - dropped_before >= WINDOWS - ENDED_WINDOWS_KEPT - 2, (dropped, dropped_before)
