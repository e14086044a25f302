"""The Prometheus alerting rules shipped for the replicas (``infra/prometheus/``) read only
series the plugin exports (``metrics.py``: a Counter's ``_total``, a Histogram's ``_bucket``,
``_sum`` and ``_count``, a Gauge's own name), at the seeds' thresholds: a hit rate under 80 %,
cold loads over 500 ms at p99, more than 10 evictions a minute."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "infra" / "prometheus" / "loragate-alerts.yml"
METRICS = ROOT / "infra" / "vllm_plugin" / "loragate_resolver" / "metrics.py"
SUFFIXES = {"Counter": ("_total",), "Histogram": ("_bucket", "_sum", "_count"), "Gauge": ("",)}


def exported() -> set[str]:
    families = re.findall(r'(Counter|Gauge|Histogram)\(\s*"(loragate_[a-z_]+)"', METRICS.read_text())
    return {name + suffix for kind, name in families for suffix in SUFFIXES[kind]}


def rules() -> dict[str, dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"]}


def test_every_series_an_alert_reads_is_one_the_replicas_export():
    series = exported()
    assert "loragate_lora_cache_total" in series and "loragate_lora_cold_load_seconds_bucket" in series
    for name, rule in rules().items():
        read = set(re.findall(r"loragate_[a-z_]+", rule["expr"]))
        assert read and read <= series, (name, read - series)


@pytest.mark.parametrize(
    ("alert", "threshold"),
    [
        ("LoragateAdapterHitRateLow", "< 0.80"),
        ("LoragateColdStartP99High", "> 0.5"),
        ("LoragateEvictionsHigh", "* 60 > 10"),
    ],
)
def test_each_alert_fires_at_the_seeds_threshold(alert, threshold):
    assert threshold in rules()[alert]["expr"]
