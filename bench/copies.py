"""What verifying replica copies costs: the resolver's check on a first load, and the byte
check ``fleet status`` / ``fleet reconcile`` add, on a fleet of 50 adapters.

Run from the repository root::

    .venv/bin/python -m bench.copies             # 50 adapters, a 64 MiB weights file
    .venv/bin/python -m bench.copies --smoke     # 5 adapters, 4 MiB: does it still run

1. The resolver plugin (``infra/vllm_plugin``, loaded from its file as vLLM loads it):
   ``lookup`` of a name whose copy it has not hashed yet (a first load after a restart),
   then again (the name asked for after an unload: stat stamps answer), against the same
   lookup with the digest check skipped -- the plugin before it verified bytes, the peer.
   On the tiny test adapter and on a copy whose weights file is ``--big-mib`` (a rank-16
   adapter of a 7B model is 30-160 MiB).
2. The copies of a fleet: ``N`` registered versions materialized into one adapter
   directory, checked as ``fleet status`` checks them (``CopyChecker``, digests read from
   the registry): cold (no stamp cache: every byte read), clean (a new checker, as each
   ``fleet status`` run is, loading the stamp cache), and after one copy changed (one file
   read again). The peer is the cold pass.

The JSON result goes to stdout and ``bench/out/copies.json``; progress to stderr.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.timing import summarize
from loragate.registry.rules.access import Principal
from loragate.registry.rules.fleet import Placement, Replica, ReplicaRole, version_path
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from loragate.registry.storage.copies import cache_file
from loragate.registry.storage.resolver_index import INDEX_FORMAT, index_entry, write_index
from loragate.tasks.reconcile import CopyChecker

ROOT = Path(__file__).resolve().parents[1]
BASE_ID = "tiny-llama"
PLUGIN = ROOT / "infra" / "vllm_plugin" / "loragate_resolver" / "__init__.py"
FILES = ("adapter_model.safetensors", "adapter_config.json", "manifest.json")


def log(msg: str) -> None:
    print(f"[copies] {msg}", file=sys.stderr, flush=True)


def _exec_plugin(name: str, *, installed: bool) -> Any:
    """The plugin's ``__init__.py`` run as package ``name`` (its folder its path); ``installed``:
    the one its sibling modules import from (``from loragate_resolver import registry_reader``)."""
    spec = importlib.util.spec_from_file_location(name, PLUGIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    if installed:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_plugin():
    """A fresh copy of the plugin's module; its siblings import as the installed package's
    would, from that package loaded once from its folder (it is installed in the replicas'
    venv, not this one)."""
    if "loragate_resolver" not in sys.modules:
        _exec_plugin("loragate_resolver", installed=True)
    return _exec_plugin("loragate_resolver_bench", installed=False)


def _digests(directory: Path) -> dict[str, str]:
    return {f: hashlib.sha256((directory / f).read_bytes()).hexdigest() for f in FILES}


def _timed_ns(fn) -> tuple[int, Any]:
    start = time.perf_counter_ns()
    found = fn()
    return time.perf_counter_ns() - start, found


def resolver_costs(bundle: Path, work: Path, label: str, rounds: int) -> dict[str, Any]:
    """First (cold) and repeated lookups of one copy, with and without the digest check."""
    adapter_dir = work / f"resolver-{label}"
    name, version = f"bench/{BASE_ID}/{label}", "v1"
    copy = Path(version_path(str(adapter_dir), name, version))
    copy.mkdir(parents=True)
    for f in FILES:
        (copy / f).write_bytes((bundle / f).read_bytes())
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["adapter_version"] = version
    (copy / "manifest.json").write_text(json.dumps(manifest))
    entry = index_entry(version, str(copy), _digests(copy))
    write_index(str(adapter_dir), {"format": INDEX_FORMAT, "roles": {"production": {name: entry}}})
    # what the registry expects, as the replica's database would answer (its query is not
    # timed here: bench/fleet measures a replica end to end)
    expected = _digests(copy)

    def expect(lora_name: str, version_id: str) -> dict[str, str]:
        return expected

    cold, repeat, unverified = [], [], []
    for _ in range(rounds):
        plugin = load_plugin()  # a fresh process's memory: nothing hashed yet
        ns, found = _timed_ns(lambda plugin=plugin: plugin.lookup(str(adapter_dir), "production", name, expect))
        assert found == (version, str(copy)), found
        cold.append(ns)
        repeat.append(_timed_ns(lambda plugin=plugin: plugin.lookup(str(adapter_dir), "production", name, expect))[0])
        plugin.damaged_files = lambda directory, files: []  # the plugin as it was: paths only
        unverified.append(
            _timed_ns(lambda plugin=plugin: plugin.lookup(str(adapter_dir), "production", name, expect))[0]
        )
    weights_mib = (copy / FILES[0]).stat().st_size / (1 << 20)
    return {
        "weights_mib": round(weights_mib, 2),
        "first_lookup": summarize(cold),
        "repeat_lookup": summarize(repeat),
        "unverified_lookup": summarize(unverified),
        "first_lookup_added_ms": round(
            (sorted(cold)[len(cold) // 2] - sorted(unverified)[len(unverified) // 2]) / 1e6, 3
        ),
    }


def big_bundle(bundle: Path, work: Path, mib: int) -> Path:
    """The tiny bundle with its weights file padded to ``mib`` MiB (what is hashed is bytes:
    their meaning does not change the cost)."""
    big = work / "big-bundle"
    big.mkdir()
    for f in FILES:
        (big / f).write_bytes((bundle / f).read_bytes())
    with open(big / FILES[0], "ab") as out:
        chunk = bytes(range(256)) * 4096  # 1 MiB
        for _ in range(mib):
            out.write(chunk)
    return big


def fleet_costs(work: Path, adapters: int) -> tuple[dict[str, Any], Path]:
    from kit.basekit import build_base
    from kit.corpus import copy_bundle, edit_tensors
    from kit.modelkit import random_adapter

    log(f"registering and materializing {adapters} adapters")
    base = build_base(work / BASE_ID)
    original = random_adapter(base, work / "adapter")
    settings = Settings(
        home=work / "home", database_url=f"sqlite:///{work / 'registry.db'}", artifacts=str(work / "artifacts")
    )
    registry = Registry.open(settings, check_schema=False, principal=Principal.in_process("bench"))
    registry.init()
    registry.add_base(str(base), BASE_ID)
    adapter_dir = work / "fleet-adapters"
    replica = Replica("http://bench:1", BASE_ID, "", ReplicaRole.PRODUCTION, str(adapter_dir), 16, 4, BASE_ID)
    placements: dict[str, Placement] = {}
    for i in range(adapters):
        bundle = copy_bundle(original, work / f"bundle-{i:03d}")
        factor = 1.0 + (i + 1) * 1e-4
        edit_tensors(bundle, lambda sd, factor=factor: {key: tensor * factor for key, tensor in sd.items()})
        name = f"tenant{i:03d}/{BASE_ID}/support"
        version = registry.register_adapter(bundle, name).version.version_id
        path = version_path(str(adapter_dir), name, version)
        registry.materialize(version, Path(path))
        placements[name] = Placement(name, version, path)

    def check() -> tuple[int, int, int]:
        checker = CopyChecker(registry)
        ns, damaged = _timed_ns(lambda: checker.damaged(replica, placements))
        checker.save()
        return ns, checker.hashed, len(damaged)

    cache_file(settings.home, adapter_dir).unlink(missing_ok=True)
    cold_ns, cold_hashed, _ = check()
    clean = [check() for _ in range(20)]
    changed = []
    for round_ in range(5):  # one copy rewritten (same bytes, new stamp): one file read again
        victim = Path(placements[f"tenant{round_:03d}/{BASE_ID}/support"].path) / FILES[0]
        victim.write_bytes(victim.read_bytes())
        changed.append(check())
    result = {
        "adapters": adapters,
        "cold": {"ms": round(cold_ns / 1e6, 2), "files_read": cold_hashed},
        "clean": {**summarize([c[0] for c in clean]), "files_read": max(c[1] for c in clean)},
        "after_one_change": {**summarize([c[0] for c in changed]), "files_read": max(c[1] for c in changed)},
        "damaged_found": max(c[2] for c in clean + changed),
    }
    registry.close()
    return result, original


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--adapters", type=int, default=50)
    parser.add_argument("--big-mib", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--smoke", action="store_true", help="5 adapters, 4 MiB, 3 rounds")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "copies.json")
    args = parser.parse_args()
    if args.smoke:
        args.adapters, args.big_mib, args.rounds = 5, 4, 3
    with tempfile.TemporaryDirectory(prefix="loragate-bench-copies-") as tmp:
        work = Path(tmp)
        fleet, bundle = fleet_costs(work, args.adapters)
        log("resolver lookups")
        result = {
            "fleet_status_copies": fleet,
            "resolver": {
                "tiny": resolver_costs(bundle, work, "tiny", args.rounds),
                "big": resolver_costs(big_bundle(bundle, work, args.big_mib), work, "big", args.rounds),
            },
        }
    text = json.dumps(result, indent=2)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
