"""No single replica's figures roll a version back (``rules/replica_agreement.py``): a live
rollback or latency breach that dropping one replica's figures undoes is held, naming that
replica; one every replica's figures carry, with any one left out, stands; a fleet of one
replica is taken as it is. Pure functions over replica documents as the fleet reads them."""

from __future__ import annotations

from typing import Any

import pytest

from loragate.registry.rules.live import LiveStats, judge_live
from loragate.registry.rules.replica_agreement import held_without_a_replica, judged_without_each, needs_agreement
from tests.support.verdicts import ADAPTER, BANDS, CANARY, PRODUCTION, WINDOW, spread


def document(url: str, canary: tuple[int, int], production: tuple[int, int], canary_ms: float = 100.0) -> dict:
    def entry(version: str, errors: int, requests: int, ms: float) -> dict[str, Any]:
        latencies = spread(min(requests, 200), ms, 3)
        return {"adapter": ADAPTER, "version": version, "window": WINDOW, "requests": requests, "errors": errors,
                "latency_ms": latencies}  # fmt: skip

    versions = [entry(CANARY, *canary, canary_ms), entry(PRODUCTION, *production, 100.0)]
    return {"replica": f"claimed-{url[-6:]}", "read_from": url, "routes": {}, "versions": versions, "alerts": []}


def judged(documents: list[dict]):
    return judge_live(BANDS, LiveStats.from_replicas(documents, ADAPTER, WINDOW, CANARY, PRODUCTION), 0.01)


def agreed(documents: list[dict]):
    full = judged(documents)
    if not needs_agreement(full, len(documents)):
        return full
    return held_without_a_replica(full, judged_without_each(documents, judged, "read_from"))


QUIET = ((0, 300), (3, 3000))
# (case, each replica's (canary errors, requests), (production errors, requests), rolls back)
FLEETS = [
    ("one-replica-making-up-failures-is-held", [((90, 300), (3, 3000)), QUIET, QUIET], False),
    ("failures-every-replica-sees-stand", [((40, 300), (3, 3000))] * 3, True),
    ("two-of-three-replicas-agreeing-stand", [((60, 300), (3, 3000)), ((60, 300), (3, 3000)), QUIET], True),
    ("a-fleet-of-one-replica-is-taken-as-it-is", [((90, 300), (3, 3000))], True),
]  # fmt: skip


@pytest.mark.parametrize(("replicas", "rolls_back"), [f[1:] for f in FLEETS], ids=[f[0] for f in FLEETS])
def test_no_single_replicas_figures_roll_a_version_back(replicas, rolls_back):
    documents = [document(f"http://replica-{i}:8000", *figures) for i, figures in enumerate(replicas)]
    assert judged(documents).rollback, "on every replica's figures together, each case rolls back"
    got = agreed(documents)
    assert got.rollback is rolls_back
    held = [r for r in got.not_ready_reasons if "rests on" in r]
    if rolls_back:
        assert held == []
    else:  # named by the URL the fleet read it from, not the name it claims
        assert held == ["the live rollback rests on the figures of http://replica-0:8000 alone: held, not acted on"]


def test_a_latency_breach_one_replica_carries_is_held_and_its_live_monitors_read_in_band():
    slow = document("http://replica-0:8000", (0, 300), (3, 3000), canary_ms=400.0)
    documents = [slow, document("http://replica-1:8000", *QUIET), document("http://replica-2:8000", *QUIET)]
    assert judged(documents).latency_breach
    got = agreed(documents)
    assert not got.latency_breach and not got.rollback
    assert all(m.in_band for m in got.monitors if m.name.startswith("live_") and "ms" in m.name)
    assert any("latency breach rests on the figures of http://replica-0:8000" in r for r in got.reasons)
