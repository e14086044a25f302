"""What a caller without the fleet's key reads of a replica's tenants, outside vLLM: the
admin guard in front of a real Starlette app answering ``/v1/models`` and ``/metrics`` as
vLLM does (adapters with a ``parent``, LoRA gauges and loragate's families labelled with
names and versions). Keyless, both name no adapter and no version; with the key, all of it.
On a real replica: tests/test_replica_surface.py."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from loragate_resolver import keyless_reads

from tests.support.guard import KEY, guarded_client

NAME = "acme/tiny-llama/support"
VERSION = "20261203_083939_ffa1a6b44e32"
MODELS = {
    "object": "list",
    "data": [
        {"id": "tiny-llama", "root": "/models/tiny", "parent": None},
        {"id": NAME, "root": "/adapters/a", "parent": "tiny-llama"},
        {"id": f"{NAME}@{VERSION}", "root": "/adapters/b", "parent": "tiny-llama"},
    ],
}
METRICS = f"""# HELP vllm:num_requests_running Number of requests running
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{engine="0",model_name="tiny-llama"}} 1.0
vllm:lora_requests_info{{max_lora="4",running_lora_adapters="{NAME}",waiting_lora_adapters=""}} 1.7e9
vllm:lora_requests_info{{max_lora="4",running_lora_adapters="",waiting_lora_adapters=""}} 1.7e9
loragate_requests_total{{adapter="{NAME}",outcome="ok",version="{VERSION}"}} 12.0
loragate_fallbacks_total{{adapter="other/tiny-llama/billing",reason="breaker"}} 1.0
loragate_base_probes_total{{outcome="same"}} 3.0
loragate_base_rows_guarded 1.0
"""


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return MODELS

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(METRICS)

    return app


@pytest.fixture
def guarded(tmp_path, monkeypatch):
    app = _app()
    with guarded_client(app, tmp_path, monkeypatch) as client:
        yield client


def names_a_tenant(text: str) -> bool:
    return NAME in text or VERSION in text or "other/tiny-llama/billing" in text


@pytest.mark.parametrize("presented", [None, "not-the-key", "Bearer " + KEY], ids=["none", "wrong", "as-a-bearer"])
def test_a_keyless_read_of_models_and_metrics_names_no_adapter_and_no_version(guarded, presented):
    headers = {"Authorization": presented} if presented and presented.startswith("Bearer") else {}
    if presented and not presented.startswith("Bearer"):
        headers = {"X-Loragate-Admin-Key": presented}
    models = guarded.get("/v1/models", headers=headers)
    assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == ["tiny-llama"]
    assert int(models.headers["content-length"]) == len(models.content)
    metrics = guarded.get("/metrics", headers=headers)
    assert metrics.status_code == 200 and not names_a_tenant(metrics.text)
    kept = metrics.text.splitlines()
    assert 'vllm:num_requests_running{engine="0",model_name="tiny-llama"} 1.0' in kept
    assert 'loragate_base_probes_total{outcome="same"} 3.0' in kept and "loragate_base_rows_guarded 1.0" in kept


def test_the_fleets_keyed_read_sees_every_adapter_and_version(guarded):
    headers = {"X-Loragate-Admin-Key": KEY}
    assert guarded.get("/v1/models", headers=headers).json() == MODELS
    assert guarded.get("/metrics", headers=headers).text == METRICS


@pytest.mark.parametrize(
    ("sample", "names"),
    [
        ('loragate_requests_total{adapter="x",outcome="ok",version="v"} 1', True),  # by label name
        ('some_gauge{model="a/b/c"} 1', True),  # an adapter's name in any label
        (f'some_gauge{{id="{VERSION}"}} 1', True),  # a version id in any label
        ('vllm:lora_requests_info{running_lora_adapters="",waiting_lora_adapters=""} 1', False),  # names none
        ('vllm:prompt_tokens_total{model_name="tiny-llama"} 5', False),
        ('vllm:cache_config_info{block_size="16",path="a/b"} 1', False),  # one slash is no adapter
        ("# HELP loragate_requests_total Requests by adapter/version/outcome", False),
        ("loragate_base_rows_guarded 1.0", False),
    ],
)
def test_a_sample_names_a_tenant_by_its_label_names_or_values(sample, names):
    assert keyless_reads.names_a_tenant(sample) is names
