"""The pins the production replicas keep resident, read from the registry with the routes: an
older registry without the table pins nothing, and a pin table the replica cannot read is an
error beside the routes, never instead of them; vLLM's pin kept to the CPU cache."""

from __future__ import annotations

import sqlite3
import sys
import types

import loragate_resolver
import pytest
from loragate_resolver import registry_reader

from tests.support import split as _plugin_on_the_path  # noqa: F401  # puts the plugin on sys.path


def registry(tmp_path, pins: str | None) -> str:
    """A secrets directory naming a SQLite registry with the tables the routes read, and
    ``pins``: the adapter_pins table's DDL (None: an older registry without it)."""
    path = tmp_path / "registry.db"
    with sqlite3.connect(path) as db:
        db.executescript(
            """CREATE TABLE adapters (id INTEGER, name TEXT);
            CREATE TABLE stage_pointers (adapter_id INTEGER, version_id TEXT, stage TEXT);
            CREATE TABLE canary_windows (id INTEGER, adapter_name TEXT, version_id TEXT, share REAL,
                                         bucket_key TEXT, status TEXT);
            INSERT INTO adapters VALUES (1, 'a/b/c'), (2, 'd/e/f');
            INSERT INTO stage_pointers VALUES (1, 'v1', 'production'), (2, 'v2', 'production');"""
        )
        if pins is not None:
            db.executescript(pins)
    secrets = tmp_path / "replica-secrets"
    secrets.mkdir()
    (secrets / "registry-url").write_text(f"sqlite:///{path}")
    return str(secrets)


PIN_TABLES = [
    ("an-older-registry", None, []),
    (
        "pinned-names",
        "CREATE TABLE adapter_pins (adapter_name TEXT, pinned_by TEXT);"
        "INSERT INTO adapter_pins VALUES ('d/e/f', 'x'), ('a/b/c', 'y'), ('a/b/c', 'z');",
        ["a/b/c", "d/e/f"],
    ),
]


@pytest.mark.parametrize(("ddl", "pins"), [c[1:] for c in PIN_TABLES], ids=[c[0] for c in PIN_TABLES])
def test_the_pins_are_read_with_the_routes_and_an_older_registry_pins_nothing(tmp_path, ddl, pins):
    rows = registry_reader.routes_with_pins(registry(tmp_path, ddl))
    assert sorted(rows.production) == [("a/b/c", "v1"), ("d/e/f", "v2")] and rows.windows == []
    assert (rows.pins, rows.pins_error) == (pins, None)


def test_a_pin_table_that_cannot_be_read_is_an_error_beside_the_routes(tmp_path):
    secrets = registry(tmp_path, "CREATE TABLE adapter_pins (other TEXT);")
    rows = registry_reader.routes_with_pins(secrets)
    assert rows.production and rows.pins is None and rows.pins_error.code == "pins_unreadable"
    assert registry_reader.routes(secrets) == (rows.production, rows.windows)  # the routes as ever


def test_the_plugin_pins_in_the_cpu_cache_only(monkeypatch):
    calls: list[str] = []

    class LRUCacheLoRAModelManager:  # vLLM 0.32's, as far as pinning goes
        def pin_adapter(self, lora_id):
            self._pin_lora_in_cpu_cache(lora_id)
            self._pin_lora_in_gpu_cache(lora_id)
            return True

        def _pin_lora_in_cpu_cache(self, lora_id):
            calls.append("cpu")

        def _pin_lora_in_gpu_cache(self, lora_id):
            calls.append("gpu")

    module = types.ModuleType("vllm.lora.model_manager")
    module.LRUCacheLoRAModelManager = LRUCacheLoRAModelManager  # type: ignore[attr-defined]
    for name in ("vllm", "vllm.lora"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "vllm.lora.model_manager", module)
    monkeypatch.setattr(loragate_resolver, "_pins_off_the_gpu", False)
    loragate_resolver.pin_in_the_cpu_cache_only()
    loragate_resolver.pin_in_the_cpu_cache_only()  # applied once
    assert LRUCacheLoRAModelManager().pin_adapter(7) is True and calls == ["cpu"]
    assert loragate_resolver.pins_off_the_gpu()
