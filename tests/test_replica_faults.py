"""The test fault injector stays out of the product: the plugin installed on every replica
holds no injector and its split injects nothing, whatever the environment says; only a
replica started with a faults file (tests, benchmarks, the demo) finds the injector
(``kit/replica_faults/loragate_faults.py``), on its ``PYTHONPATH``, and names it as its split.
What the injected faults do to the split: tests/test_traffic_split_units.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

from loragate_faults import FaultInjectingSplit
from loragate_resolver.traffic import TrafficSplit

from loragate.local.replica_config import ADMIN_GUARD, ReplicaConfig
from loragate.local.replica_split import FAULT_INJECTING_SPLIT, FAULTS_ROOT, FAULTS_VARIABLE, TRAFFIC_SPLIT
from tests.support.split import NAME, PLUGIN_DIR, FakeVllm, ask, window

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "infra" / "vllm_plugin" / "loragate_resolver"
# vLLM 0.32's own loading of ``--middleware`` (vllm/entrypoints/serve/middleware/register.py)
LOAD_MIDDLEWARE = """
import importlib, inspect, sys
module_path, object_name = sys.argv[1].rsplit(".", 1)
imported = getattr(importlib.import_module(module_path), object_name)
assert inspect.isclass(imported)
print(imported.__mro__[1].__module__, imported(None).faults.path)
"""


def test_the_shipped_plugin_holds_no_fault_injector():
    modules = sorted(p for p in SHIPPED.rglob("*.py") if "__pycache__" not in p.parts)
    assert modules and not [p.name for p in modules if "fault" in p.name]
    readers = [p.name for p in modules if FAULTS_VARIABLE in p.read_text() or "loragate_faults" in p.read_text()]
    assert readers == []
    plugin = tomllib.loads((SHIPPED.parent / "pyproject.toml").read_text())
    assert plugin["tool"]["setuptools"]["packages"] == ["loragate_resolver"]


def test_the_plugins_split_injects_nothing_whatever_the_environment_says(split_env):
    split_env.write_text(json.dumps({"c1": {"error": True}, "breaker": {"errors": 1}}))
    shipped = TrafficSplit(FakeVllm())
    shipped._loop = "off"  # type: ignore[assignment]  # no background reads: the test sets the table
    shipped.routes, shipped.loaded, shipped.table_started = {NAME: window(9, "c1", 1.0)}, True, float("inf")
    _, headers, _ = ask(shipped)
    assert headers[b"x-loragate-version"] == b"c1" and b"x-loragate-fallback" not in headers
    assert shipped.faults.of("c1") == {} and shipped.current_limits() == shipped.limits


def test_the_injectors_split_is_the_plugins_but_for_the_faults():
    assert FaultInjectingSplit.__bases__ == (TrafficSplit,)
    assert set(vars(FaultInjectingSplit)) - {"__module__", "__doc__", "__init__"} == set()
    assert Path(sys.modules["loragate_faults"].__file__).parent == FAULTS_ROOT
    module, name = FAULT_INJECTING_SPLIT.rsplit(".", 1)
    assert (FaultInjectingSplit.__module__, FaultInjectingSplit.__name__) == (module, name)


def test_only_a_replica_given_a_faults_file_names_the_injector_and_finds_it(tmp_path):
    parent = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}  # never inherited
    served = ReplicaConfig(tmp_path, "tiny-llama", adapter_dir=tmp_path / "a", secrets_dir=tmp_path / "s")
    command = served.command()
    assert [command[i + 1] for i, a in enumerate(command) if a == "--middleware"] == [ADMIN_GUARD, TRAFFIC_SPLIT]
    assert {"PYTHONPATH", FAULTS_VARIABLE} & set(served.environment(parent)) == set()

    tested = ReplicaConfig(**{**vars(served), "faults_file": tmp_path / "faults.json"})
    command = tested.command()
    assert [command[i + 1] for i, a in enumerate(command) if a == "--middleware"] == [
        ADMIN_GUARD,
        FAULT_INJECTING_SPLIT,
    ]
    env = tested.environment(parent)
    assert env["PYTHONPATH"] == str(FAULTS_ROOT) and env[FAULTS_VARIABLE] == str(tmp_path / "faults.json")


def test_vllm_finds_the_injector_on_a_test_replicas_path_and_on_no_other(tmp_path):
    """As the replica's interpreter loads ``--middleware``: the plugin is installed there (here:
    its folder on the path), the injector only on the path a faults file adds."""
    tested = ReplicaConfig(tmp_path, "tiny-llama", secrets_dir=tmp_path, faults_file=tmp_path / "faults.json")
    env = tested.environment({"PATH": os.environ["PATH"]})
    env["PYTHONPATH"] += os.pathsep + str(PLUGIN_DIR)
    found = subprocess.run(
        [sys.executable, "-c", LOAD_MIDDLEWARE, FAULT_INJECTING_SPLIT],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 0, found.stderr
    assert found.stdout.split() == ["loragate_resolver.traffic", str(tmp_path / "faults.json")]

    served = {"PATH": os.environ["PATH"], "PYTHONPATH": str(PLUGIN_DIR), FAULTS_VARIABLE: str(tmp_path / "f.json")}
    refused = subprocess.run(
        [sys.executable, "-c", LOAD_MIDDLEWARE, FAULT_INJECTING_SPLIT],
        env=served,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and "No module named 'loragate_faults'" in refused.stderr
