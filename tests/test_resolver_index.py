"""The resolver index on disk: what the vLLM plugin reads, and what concurrent writers keep.

The plugin answers a name only with the version the index names, and only while the bundle
on disk is the one the registry's digests say -- a missing or garbage index, a flipped byte,
an edited config, a symlink, a path outside the adapter directory, another version's
bundle: no answer. A request admitted before an unload is served from the index, not
refused (the plugin's patch, run under the real vLLM). Writers of different adapters,
racing under the index's file lock, never lose each other's entries. How the index is
built from the fleet's plan is ``test_fleet_model.py``'s.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from kit.tamper import flip_a_byte
from loragate.registry.rules.fleet import version_path
from loragate.registry.storage.resolver_index import INDEX_FILE, INDEX_FORMAT, index_entry, read_index, write_index
from tests.support.races import released_at_once
from tests.test_fleet_model import NAME

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = ROOT / "infra" / "vllm_plugin" / "loragate_resolver" / "__init__.py"


@pytest.fixture(scope="module")
def resolver():
    """The plugin module as vLLM imports it (it needs vLLM only inside ``register``)."""
    if str(PLUGIN.parents[1]) not in sys.path:  # its sibling modules import as installed
        sys.path.insert(0, str(PLUGIN.parents[1]))
    spec = importlib.util.spec_from_file_location("loragate_resolver_under_test", PLUGIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUNDLE_FILES = ("adapter_model.safetensors", "adapter_config.json", "manifest.json")


def _bundle(directory: Path, version: str) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "manifest.json").write_text(json.dumps({"adapter_version": version}))
    (directory / "adapter_config.json").write_text(json.dumps({"r": 8}))
    (directory / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 64 + version.encode())
    return str(directory)


def _files(directory: str | Path) -> dict[str, str]:
    return {f: hashlib.sha256((Path(directory) / f).read_bytes()).hexdigest() for f in BUNDLE_FILES}


def _swap_for_symlink(path: Path, target: Path) -> None:
    path.unlink()
    path.symlink_to(target)


RESOLVER_CASES = [
    # (case, how the adapter directory is changed after a good index is written, resolves?)
    ("the index names it", lambda d, entry: None, True),
    ("no index", lambda d, entry: (d / INDEX_FILE).unlink(), False),
    ("garbage index", lambda d, entry: (d / INDEX_FILE).write_text("{not json"), False),
    ("another format", lambda d, entry: _rewrite(d, lambda i: {**i, "format": 1}), False),
    ("a byte flipped in the weights", lambda d, entry: flip_a_byte(Path(entry["path"]) / BUNDLE_FILES[0]), False),
    ("the config edited", lambda d, entry: (Path(entry["path"]) / BUNDLE_FILES[1]).write_text('{"r": 64}'), False),
    ("the weights missing", lambda d, entry: (Path(entry["path"]) / BUNDLE_FILES[0]).unlink(), False),
    (
        "the weights a symlink to an identical file",
        lambda d, entry: _swap_for_symlink(
            Path(entry["path"]) / BUNDLE_FILES[0], d.parent / "elsewhere" / BUNDLE_FILES[0]
        ),
        False,
    ),
    # the index's own digests are not consulted: the registry's decide
    ("an entry without digests", lambda d, entry: _rewrite(d, lambda i: _set_entry(i, {**entry, "files": {}})), True),
    (
        "a digest naming a path",
        lambda d, entry: _rewrite(
            d, lambda i: _set_entry(i, {**entry, "files": {**entry["files"], "../../elsewhere/x": "0" * 64}})
        ),
        True,
    ),
    (
        "the weights and their index digest both rewritten",
        lambda d, entry: _rewrite_weights_and_digest(d, entry),
        False,
    ),
    ("entry not an object", lambda d, entry: _rewrite(d, lambda i: _set_entry(i, "v1")), False),
    (
        "path outside the directory",
        lambda d, entry: _rewrite(d, lambda i: _set_entry(i, {**entry, "path": "/etc"})),
        False,
    ),
    (
        "path escaping with ..",
        lambda d, entry: _rewrite(d, lambda i: _set_entry(i, {**entry, "path": str(d / ".." / "elsewhere")})),
        False,
    ),
    ("bundle removed", lambda d, entry: (Path(entry["path"]) / "manifest.json").unlink(), False),
    ("bundle of another version", lambda d, entry: _bundle(Path(entry["path"]), "v0"), False),
    (
        "entry for another role only",
        lambda d, entry: _rewrite(d, lambda i: {**i, "roles": {"canary": i["roles"]["production"]}}),
        False,
    ),
]


def _rewrite_weights_and_digest(directory: Path, entry: dict) -> None:
    weights = Path(entry["path"]) / BUNDLE_FILES[0]
    weights.write_bytes(b"forged" + weights.read_bytes())
    _rewrite(directory, lambda i: _set_entry(i, {**entry, "files": _files(entry["path"])}))


def _rewrite(directory: Path, change) -> None:
    index = json.loads((directory / INDEX_FILE).read_text())
    (directory / INDEX_FILE).write_text(json.dumps(change(index)))


def _set_entry(index: dict, entry) -> dict:
    index["roles"]["production"][NAME] = entry
    return index


@pytest.mark.parametrize(("case", "change", "resolves"), RESOLVER_CASES, ids=[c[0] for c in RESOLVER_CASES])
def test_the_resolver_answers_only_with_the_version_the_index_names_and_the_bundle_is(
    resolver, tmp_path, case, change, resolves
):
    adapter_dir = tmp_path / "adapters"
    path = _bundle(Path(version_path(str(adapter_dir), NAME, "v1")), "v1")
    entry = index_entry("v1", path, _files(path))
    write_index(str(adapter_dir), {"format": INDEX_FORMAT, "roles": {"production": {NAME: entry}}})
    (tmp_path / "elsewhere").mkdir()
    _bundle(tmp_path / "elsewhere", "v1")
    recorded = dict(entry["files"])

    def registry(name: str, version: str) -> dict[str, str]:
        """What the registry's database answers (tests/test_replica_expectations.py asks a real one)."""
        if (name, version) != (NAME, "v1"):
            raise resolver.registry_reader.NotServable(f"{name} = {version}", "unknown_version")
        return recorded

    # hashed once while good: what is remembered must not hide a later change
    assert resolver.lookup(str(adapter_dir), "production", NAME, registry) == ("v1", path)
    change(adapter_dir, entry)
    found = resolver.lookup(str(adapter_dir), "production", NAME, registry)
    assert found == (("v1", path) if resolves else None)
    assert resolver.lookup(str(adapter_dir), "production", "other/tiny-llama/name", registry) is None


WINDOW_PROBE = """
import json, sys, types
sys.path.insert(0, sys.argv[1])
import loragate_resolver
from vllm.entrypoints.serve.engine.serving import BaseServing
from vllm.utils.counter import AtomicCounter

# the registry's answer for the version (tests/test_replica_expectations.py asks a real one)
files = json.loads(sys.argv[4])
loragate_resolver.close_the_unload_window(sys.argv[2], "production", lambda name, version: files)
# the state an admitted request meets when a switch unloaded its name after _check_model:
# the name is gone from the front end's table; everything else is vLLM's own code
models = types.SimpleNamespace(lora_requests={}, lora_id_counter=AtomicCounter(7))
serving = types.SimpleNamespace(models=models, _is_model_supported=lambda name: name == "tiny-llama")
answers = {}
for name in (sys.argv[3], sys.argv[3], "tiny-llama", "unknown/tiny-llama/task"):
    try:
        got = BaseServing._maybe_get_adapters(serving, types.SimpleNamespace(model=name))
        answers.setdefault(name, []).append(None if got is None else [got.lora_path, got.lora_int_id])
    except Exception as e:
        answers.setdefault(name, []).append(type(e).__name__)
print(json.dumps(answers))
"""


@pytest.mark.slow
def test_a_request_admitted_before_an_unload_is_served_from_the_index_not_refused(tmp_path):
    """vLLM checks the adapter name, renders the prompt, then looks the name up again; an
    unload in between is a 404 unless the plugin's patch answers from the index."""
    vllm_python = ROOT / ".venv-vllm" / "bin" / "python"
    adapter_dir = tmp_path / "adapters"
    path = _bundle(Path(version_path(str(adapter_dir), NAME, "v2")), "v2")
    entry = index_entry("v2", path, _files(path))
    write_index(str(adapter_dir), {"format": INDEX_FORMAT, "roles": {"production": {NAME: entry}}})
    probe = subprocess.run(
        [
            str(vllm_python),
            "-c",
            WINDOW_PROBE,
            str(PLUGIN.parent.parent),
            str(adapter_dir),
            NAME,
            json.dumps(_files(path)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    answers = json.loads(probe.stdout.strip().splitlines()[-1])
    # served from the index's path, both times under one id: the engine loads it once
    assert answers[NAME] == [[path, 8], [path, 8]]
    assert answers["tiny-llama"] == [None]  # the base model is not an adapter
    assert answers["unknown/tiny-llama/task"] == ["VLLMNotFoundError"]  # what the index does not name stays a 404


def test_concurrent_index_writers_of_different_adapters_never_lose_each_others_entries(tmp_path):
    """Each writer changes only its adapter's entries, under the index's file lock: eight
    adapters written 25 times each from eight threads released at once all end up there."""
    from loragate.registry.storage.resolver_index import replace_entries

    adapter_dir = str(tmp_path / "adapters")
    names = [f"acme/tiny-llama/t{i}" for i in range(8)]

    def writer(name: str) -> None:
        for round_ in range(25):
            entry = {"version": f"v{round_}", "path": f"/p/{name}/v{round_}"}
            replace_entries(adapter_dir, name, {"canary": entry, "production": entry})

    assert released_at_once([lambda n=n: writer(n) for n in names], timeout_s=60) == []
    roles = read_index(adapter_dir)["roles"]
    for role in ("canary", "production"):
        assert {n: e["version"] for n, e in roles[role].items()} == dict.fromkeys(names, "v24")


def test_replacing_an_adapters_entries_returns_what_they_were_and_none_removes_it(tmp_path):
    from loragate.registry.storage.resolver_index import replace_entries

    adapter_dir = str(tmp_path / "adapters")
    one, other = {"version": "v1", "path": "p1"}, {"version": "o1", "path": "q1"}
    replace_entries(adapter_dir, "acme/tiny-llama/other", {"production": other})
    assert replace_entries(adapter_dir, NAME, {"production": one, "canary": None}) == {
        "production": None,
        "canary": None,
    }
    assert replace_entries(adapter_dir, NAME, {"production": None}) == {"production": one}
    roles = read_index(adapter_dir)["roles"]
    assert roles["production"] == {"acme/tiny-llama/other": other} and roles["canary"] == {}
