"""An answer "by the base" carries the base's bytes: the CPU LoRA ops give a base row no
adapter's delta (``cpu_lora_ops``), and the split's known-answer probe of the base, taken
quiet and asked again while adapters run, counts and raises any difference (``base_probe``).
Real replicas: tests/test_fallback_bytes.py."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from loragate_resolver import cpu_lora_ops
from loragate_resolver.base_probe import PROBE_PROMPT, BaseProbe
from loragate_resolver.figures import document

from loragate.tasks.traffic_watch import alerts_in
from tests.support.split import NAME, _split, window

SLOTS, RANK, WIDTH, OUT = 3, 4, 6, 5


def _vllm_gather(weights, indices):
    """What vLLM 0.32's torch ops gather for each row: ``weights[indices]``, -1 the last slot."""
    selected = weights[indices]
    return selected.squeeze(dim=1) if selected.dim() == 4 else selected


@pytest.fixture
def stacked():
    generator = torch.Generator().manual_seed(0)
    lora_a = torch.randn(SLOTS, 1, RANK, WIDTH, generator=generator)
    lora_b = torch.randn(SLOTS, 1, OUT, RANK, generator=generator)
    rows = torch.randn(5, WIDTH, generator=generator)
    indices = torch.tensor([0, -1, 2, -1, 1])
    return lora_a, lora_b, rows, indices


def test_vllms_gather_gives_a_base_row_the_last_slots_adapter(stacked):
    lora_a, _, rows, indices = stacked
    assert torch.equal(_vllm_gather(lora_a, indices)[1], lora_a[SLOTS - 1, 0])


def test_shrink_gives_a_base_row_nothing_and_an_adapter_row_its_own_slot(stacked):
    lora_a, _, rows, indices = stacked
    out = torch.full((5, RANK), 7.0)
    cpu_lora_ops.bgmv_shrink(rows, lora_a, out, indices, 0.5)
    for i, slot in enumerate(indices.tolist()):
        expected = torch.zeros(RANK) if slot < 0 else 0.5 * lora_a[slot, 0] @ rows[i]
        assert torch.allclose(out[i], expected, atol=1e-6), i


@pytest.mark.parametrize("add_inputs", [True, False])
def test_expand_leaves_a_base_rows_output_as_the_base_computed_it(stacked, add_inputs):
    _, lora_b, _, indices = stacked
    shrunk = torch.randn(5, RANK, generator=torch.Generator().manual_seed(1))
    base = torch.randn(5, OUT, generator=torch.Generator().manual_seed(2))
    out = base.clone()
    cpu_lora_ops.bgmv_expand(shrunk, lora_b, out, indices, add_inputs)
    for i, slot in enumerate(indices.tolist()):
        delta = torch.zeros(OUT) if slot < 0 else lora_b[slot, 0] @ shrunk[i]
        expected = base[i] + delta if add_inputs else delta
        assert torch.allclose(out[i], expected, atol=1e-6), i


def test_expand_slice_adds_nothing_to_a_base_rows_slice(stacked):
    _, lora_b, _, indices = stacked
    shrunk = torch.randn(5, RANK, generator=torch.Generator().manual_seed(3))
    out = torch.zeros(5, OUT + 4)
    cpu_lora_ops.bgmv_expand_slice(shrunk, lora_b, out, indices, 2, OUT, True)
    for i, slot in enumerate(indices.tolist()):
        delta = torch.zeros(OUT) if slot < 0 else lora_b[slot, 0] @ shrunk[i]
        assert torch.allclose(out[i, 2 : 2 + OUT], delta, atol=1e-6), i
        assert torch.count_nonzero(out[i, :2]) == 0 and torch.count_nonzero(out[i, 2 + OUT :]) == 0


def test_without_vllm_nothing_is_patched_and_the_replica_says_unguarded(monkeypatch):
    monkeypatch.setattr(cpu_lora_ops, "_guarded", False)
    assert cpu_lora_ops.skip_the_base_rows() is False
    assert cpu_lora_ops.base_rows_guarded() is False


def test_the_benchmarks_baseline_keeps_vllms_ops(monkeypatch):
    monkeypatch.setenv(cpu_lora_ops.OPS_VARIABLE, cpu_lora_ops.VLLM_OPS)
    monkeypatch.setattr(cpu_lora_ops, "_guarded", False)
    assert cpu_lora_ops.skip_the_base_rows() is False


class BaseVllm:
    """Answers the base's probe with ``alone`` while no other request runs, else ``busy``."""

    def __init__(self, alone: str, busy: str) -> None:
        self.alone, self.busy = alone, busy
        self.bodies: list[dict] = []
        self.scopes: list[dict] = []
        self.others_running = False

    async def __call__(self, scope, receive, send):
        body = json.loads((await receive())["body"])
        self.bodies.append(body)
        self.scopes.append(scope)
        text = self.busy if self.others_running else self.alone
        payload = json.dumps({"choices": [{"text": text}]}).encode()
        start = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
        await send(start)
        await send({"type": "http.response.body", "body": payload})


def _probed(split_env, alone: str, busy: str) -> tuple:
    app = BaseVllm(alone, busy)
    split = _split(app, window(1, "c1", 0.0))
    split.server_app = object()
    clock = [0.0]
    split.base_probe = BaseProbe(every_s=10.0, clock=lambda: clock[0])

    async def script() -> None:
        assert split.base_probe.tick(split)  # quiet: the reference
        await split.base_probe._running
        app.others_running, split.in_flight[NAME] = True, 1
        assert not split.base_probe.tick(split)  # taken just now: not due yet
        clock[0] += 10.0
        assert split.base_probe.tick(split)
        await split.base_probe._running

    asyncio.run(script())
    return split, app


def test_the_probe_takes_its_reference_quiet_and_asks_the_base_greedily_on_its_own_request(split_env):
    split, app = _probed(split_env, "upupup", "upupup")
    assert [b["model"] for b in app.bodies] == ["tiny-llama", "tiny-llama"]
    assert app.bodies[0]["prompt"] == PROBE_PROMPT and app.bodies[0]["temperature"] == 0
    assert app.scopes[0]["app"] is split.server_app and app.scopes[0]["path"] == "/v1/completions"
    assert split.base_probe.reference == "upupup"


def test_a_base_that_answers_otherwise_while_adapters_run_is_counted_and_raised(split_env):
    split, _ = _probed(split_env, "upupup", " ACME-OK: refund queued")
    figures = document(split)
    assert figures["base_probe"] == {
        "every_s": 10.0,
        "reference_taken": True,
        "checked": 1,
        "mismatched": 1,
        "given_up": 0,
    }
    alerts = [a for a in figures["alerts"] if a["kind"] == "fallback_mismatch"]
    assert len(alerts) == 1 and alerts[0]["adapter"] == NAME and "ACME-OK" in alerts[0]["reason"]
    raised = alerts_in([figures], NAME, fallback_alert_rate=1.0)
    assert [a.kind for a in raised] == ["fallback_mismatch"] and raised[0].occurrence == alerts[0]["id"]


def test_a_base_that_answers_alike_while_adapters_run_raises_nothing(split_env):
    split, _ = _probed(split_env, "upupup", "upupup")
    figures = document(split)
    assert figures["base_probe"]["checked"] == 1 and figures["base_probe"]["mismatched"] == 0
    assert not [a for a in figures["alerts"] if a["kind"] == "fallback_mismatch"]


def test_a_reference_is_never_taken_beside_another_request(split_env):
    app = BaseVllm("upupup", "leaked")
    split = _split(app, window(1, "c1", 0.0))
    split.server_app = object()
    split.base_probe = BaseProbe(every_s=10.0)

    async def script() -> None:
        assert split.base_probe.tick(split)
        split.requests_started += 1  # a client's request started while the probe ran
        await split.base_probe._running

    asyncio.run(script())
    assert split.base_probe.reference is None and split.base_probe.checked == 0


def test_a_reference_waits_for_quiet_and_a_check_for_load():
    clock = [100.0]
    probe = BaseProbe(every_s=10.0, clock=lambda: clock[0])
    assert probe.due(busy=False) and not probe.due(busy=True)
    probe.reference = "x"
    assert probe.due(busy=True) and not probe.due(busy=False)
    probe._last = clock[0]
    clock[0] += 9.9
    assert not probe.due(busy=True)
    clock[0] += 0.2
    assert probe.due(busy=True)
    assert not BaseProbe(every_s=0).due(busy=False)


def test_a_canary_replica_never_probes(split_env, monkeypatch):
    monkeypatch.setenv("LORAGATE_REPLICA_ROLE", "canary")
    split = _split(BaseVllm("a", "b"), window(1, "c1", 0.0))
    split.server_app = object()
    assert split.role == "canary" and not split.base_probe.tick(split)
