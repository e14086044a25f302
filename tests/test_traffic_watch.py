"""The always-on traffic watch on real replicas: a production adapter whose version keeps
failing raises its own fallback-rate and breaker alerts with no canary window open, each
announced once; the replicas are read for alerts only, and for the adapters in production.
The fleet's reads over a written registry: tests/test_live_figures.py."""

from __future__ import annotations

import json

import httpx
import pytest

from loragate.tasks.live_figures import read_live_figures
from loragate.tasks.traffic_watch import watch_traffic
from tests.support.fleet import SUPPORT_PROMPT, make_fleet

pytestmark = pytest.mark.slow

USERS = [f"watched-{i}" for i in range(24)]


def productions(fleet) -> list:
    return [r for r in fleet.replicas.values() if r.role == "production"]


@pytest.fixture
def in_production(tmp_path, replicas, replica_adapters, validated_adapters):
    """v1 in production, no canary window: steady state."""
    fleet = make_fleet(tmp_path, replicas, replica_adapters, validated_adapters)
    fleet.promote(fleet.v1, "canary")
    fleet.promote(fleet.v1, "production")
    yield fleet
    for replica in productions(fleet):
        replica.faults_file.write_text("{}")
    fleet.registry.close()


def test_a_production_adapter_falling_back_with_no_window_open_raises_its_alerts_once(in_production):
    fleet = in_production
    assert fleet.registry.canary_windows() == []
    for replica in productions(fleet):
        replica.faults_file.write_text(json.dumps({fleet.v1: {"error": True}}))
    for user in USERS:
        for replica in productions(fleet):
            body = {"model": fleet.name, "prompt": SUPPORT_PROMPT, "max_tokens": 1, "user": user}
            answered = httpx.post(replica.url + "/v1/completions", json=body, timeout=60)
            assert answered.status_code == 200 and answered.headers["x-loragate-fallback"]

    raised, unreadable = watch_traffic(fleet.registry)

    assert not unreadable
    urls = {r.url for r in productions(fleet)}
    ours = [a for a in raised if a.name == fleet.name]
    assert {a.replica for a in ours if a.kind == "fallback_rate"} == urls
    assert {a.replica for a in ours if a.kind == "breaker_open" and a.version_id == fleet.v1} == urls
    assert all(a.occurrence for a in ours if a.kind == "breaker_open")
    again, _ = watch_traffic(fleet.registry)
    assert [a for a in again if a.name == fleet.name] == []  # the same trips and rates: announced already


def test_the_watch_reads_no_samples_and_an_evaluation_only_its_adapters(in_production):
    fleet = in_production
    for user in USERS[:4]:
        body = {"model": fleet.name, "prompt": SUPPORT_PROMPT, "max_tokens": 1, "user": user}
        httpx.post(productions(fleet)[0].url + "/v1/completions", json=body, timeout=60)
    alerts_only = read_live_figures(fleet.registry, [fleet.name], alerts_only=True).of(fleet.name)
    assert alerts_only.documents and all(d["versions"] == [] for d in alerts_only.documents)
    figures = read_live_figures(fleet.registry, [fleet.name]).of(fleet.name)
    versions = [v for d in figures.documents for v in d["versions"]]
    assert versions and {v["adapter"] for v in versions} == {fleet.name}
    other = read_live_figures(fleet.registry, ["acme/tiny-llama/nobody"]).of("acme/tiny-llama/nobody")
    assert other.documents and all(d["versions"] == [] and d["routes"] == {} for d in other.documents)
