"""The canary's probes on a real replica, reached through a proxy that loses or garbles one
answer: a probe is asked again once before its failure counts (one that fails twice is
evidence for the sequential probe error rule, not a rollback on its own), and a golden answer
that differs from validation's is read a second time before it counts as drift -- while a
replica that fails every probe, or a version that really drifts, is still rolled back. A
first canary (no production version) is judged against the base on its own replica."""

from __future__ import annotations

import pytest

from kit.http_faults import CompletionFault, FaultProxy
from loragate.registry.rules.canary import Verdict
from loragate.tasks.canary import observe_window
from loragate.tasks.canary_moves import deploy_canary
from loragate.tasks.routes import stage_replicas
from tests.support.fleet import SUPPORT_PROMPT, admin_client, make_fleet

pytestmark = pytest.mark.slow


@pytest.fixture
def dark(tmp_path, replicas, replica_adapters, validated_adapters):
    """v1 in production, v2 on the canary replica with no share of live traffic (its probes
    go to the canary replica), which is reached through a fault proxy."""
    fleet = make_fleet(tmp_path, replicas, replica_adapters, validated_adapters, canary_share=0.0, canary_window_s=3600)
    fleet.promote(fleet.v1, "canary")
    fleet.promote(fleet.v1, "production")
    deployment = deploy_canary(fleet.registry, fleet.v2)
    canary = next(r for r in fleet.registry.list_replicas() if r.role == "canary")
    proxy = FaultProxy(canary.url)
    fleet.registry.remove_replica(canary.url)
    fleet.registry.add_replica(proxy.url, "tiny-llama", "canary", canary.adapter_dir)
    try:
        yield fleet, deployment.window, proxy
    finally:
        fleet.registry.remove_replica(proxy.url)
        fleet.registry.add_replica(canary.url, "tiny-llama", "canary", canary.adapter_dir)
        proxy.close()
        fleet.registry.close()


def test_a_probe_lost_once_is_asked_again_and_counts_no_error(dark):
    fleet, window, proxy = dark
    proxy.next_completions = [CompletionFault.ERROR_500]
    observation, _ = observe_window(fleet.registry, window)
    assert proxy.next_completions == [], "the lost answer was asked for"
    assert observation.canary.errors == 0 and observation.verdict == Verdict.CONTINUE, observation.reasons


def test_a_probe_that_fails_again_counts_as_the_canarys_error_and_one_is_noise(dark):
    fleet, window, proxy = dark
    proxy.next_completions = [CompletionFault.ERROR_500] * 2
    observation, _ = observe_window(fleet.registry, window)
    assert observation.canary.errors == 1 and observation.verdict == Verdict.CONTINUE, observation.reasons
    assert observation.probe_evidence is not None and observation.probe_evidence["seen"][1] == 1


def test_a_canary_failing_every_probe_is_rolled_back_at_once(dark):
    fleet, window, proxy = dark
    proxy.next_completions = [CompletionFault.ERROR_500] * 1000
    observation, _ = observe_window(fleet.registry, window)
    assert observation.canary.errors == observation.canary.requests > 0
    assert observation.verdict == Verdict.ROLLBACK and any("probe errors worse" in r for r in observation.reasons)


def test_a_golden_answer_garbled_once_is_read_again_and_is_no_drift(dark):
    fleet, window, proxy = dark
    proxy.next_completions = [CompletionFault.GARBLE]
    observation, _ = observe_window(fleet.registry, window)
    assert proxy.next_completions == [] and observation.drift == 0.0, observation.reasons
    assert observation.verdict == Verdict.CONTINUE


def test_a_golden_answer_that_differs_on_both_reads_is_drift(dark):
    fleet, window, proxy = dark
    proxy.next_completions = [CompletionFault.GARBLE] * 2
    observation, _ = observe_window(fleet.registry, window)
    assert observation.drift > 0 and observation.verdict == Verdict.ROLLBACK, observation.reasons
    assert any("golden_drift" in r for r in observation.reasons)


@pytest.fixture
def first(tmp_path, replicas, replica_adapters, validated_adapters):
    """v1 the adapter's first canary: no production version, no share of live traffic."""
    fleet = make_fleet(tmp_path, replicas, replica_adapters, validated_adapters, canary_share=0.0, canary_window_s=3600)
    deployment = deploy_canary(fleet.registry, fleet.v1)
    try:
        yield fleet, deployment.window
    finally:
        fleet.registry.close()


def test_a_first_canary_as_costly_as_lora_is_judged_against_the_base_on_its_own_replica_and_kept(first):
    """LoRA's own arithmetic costs more than the bare base on every prompt; a first canary is
    held to ``LORAGATE_CANARY_FIRST_P95_RATIO`` of the base asked on the same replica right
    after it, so a good one is never rolled back for being an adapter."""
    fleet, window = first
    observations = [observe_window(fleet.registry, fleet.registry.canary_window(window.id))[0] for _ in range(3)]
    assert [o.verdict for o in observations if o.verdict == Verdict.ROLLBACK] == []
    for o in observations:
        assert o.production.errors == 0 and o.canary.errors == 0
        assert len(o.pairs_ms) == len(o.canary.latencies_ms) > 0  # every probe paired with the base


def test_a_probe_reference_does_the_canarys_work_exactly_as_many_tokens_as_its_answer(first):
    """The reference of a pair generates exactly as many tokens as the canary's answer, its
    own end of text ignored until then: unequal answers compare lengths, not speed (the base
    runs on to ``max_tokens`` where a trained adapter stops early)."""
    fleet, _ = first
    canary = stage_replicas(fleet.registry, fleet.name)[0][0]
    with admin_client(fleet.registry, canary.url) as client:
        short = client.complete(fleet.name, SUPPORT_PROMPT, 32, admin=True)
        assert short.token_ids and len(short.token_ids) < 32, "the adapter stops at its own end of text"
        longer = len(short.token_ids) + 5
        for model in (fleet.name, canary.served_model_name):
            exact = client.complete(model, SUPPORT_PROMPT, longer, admin=True, exact_tokens=True)
            assert len(exact.token_ids or ()) == longer, model
