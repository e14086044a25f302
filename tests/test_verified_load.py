"""The engine loads exactly the bytes that were checked (the plugin's ``verified_load``): the
worker's loader reads a bundle once, hashes those bytes against the registry's digests and
hands vLLM a private copy of them; a swapped file, a link re-aimed after a check, a bundle
outside the adapter directory or a version the registry refuses is never loaded; an outage
reloads only what this process loaded before, against the digests it had then."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "infra" / "vllm_plugin"
if str(PLUGIN_DIR) not in sys.path:
    sys.path.insert(0, str(PLUGIN_DIR))
from loragate_resolver import registry_reader, verified_load  # noqa: E402

NAME = "acme/tiny-llama/support"


def _bundle(adapter_dir: Path, version: str, weights: bytes = b"weights") -> tuple[Path, dict]:
    path = adapter_dir / "acme" / "tiny-llama" / "support" / version
    path.mkdir(parents=True)
    contents = {
        "adapter_model.safetensors": weights,
        "adapter_config.json": b'{"r": 8}',
        "manifest.json": json.dumps({"adapter_version": version}).encode(),
    }
    for file, data in contents.items():
        (path / file).write_bytes(data)
    return path, {file: hashlib.sha256(data).hexdigest() for file, data in contents.items()}


class Registry:
    """What the registry answers for (name, version): digests, or a refusal."""

    def __init__(self) -> None:
        self.answers: dict[tuple[str, str], object] = {}

    def __call__(self, name: str, version: str) -> dict:
        found = self.answers.get((name, version), registry_reader.NotServable("no", "unknown_version"))
        if isinstance(found, Exception):
            raise found
        return found  # type: ignore[return-value]


@pytest.fixture
def loads(tmp_path):
    adapters, private = tmp_path / "adapters", tmp_path / "private"
    adapters.mkdir()
    private.mkdir()
    registry = Registry()
    return verified_load.CheckedLoads(str(adapters), registry, str(private)), adapters, registry


def test_the_copy_handed_to_vllm_holds_exactly_the_bytes_that_were_hashed(loads):
    checks, adapters, registry = loads
    path, digests = _bundle(adapters, "v1")
    registry.answers[(NAME, "v1")] = digests
    copy = Path(checks.copy(NAME, str(path)))
    assert {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in copy.iterdir()} == digests
    assert not str(copy).startswith(str(adapters))  # not on the volume its writers share
    (path / "adapter_model.safetensors").write_bytes(b"swapped after the check")
    assert (copy / "adapter_model.safetensors").read_bytes() == b"weights"


def _swapped(adapters, registry):
    path, digests = _bundle(adapters, "v1")
    registry.answers[(NAME, "v1")] = digests
    (path / "adapter_model.safetensors").write_bytes(b"swapped")
    return path


def _linked(adapters, registry):
    path, digests = _bundle(adapters, "v1")
    registry.answers[(NAME, "v1")] = digests
    link = adapters / "acme" / "tiny-llama" / "support" / "v1-link"
    os.symlink(path, link)
    return link


def _outside(adapters, registry):
    path, digests = _bundle(adapters.parent / "elsewhere", "v1")
    registry.answers[(NAME, "v1")] = digests
    return path


def _refused(adapters, registry):
    path, _ = _bundle(adapters, "v1")
    registry.answers[(NAME, "v1")] = registry_reader.NotServable("rolled back", "not_permitted")
    return path


def _unreadable(adapters, registry):
    path, digests = _bundle(adapters, "v1")
    registry.answers[(NAME, "v1")] = digests
    (path / "adapter_config.json").unlink()
    return path


REFUSED = [_swapped, _linked, _outside, _refused, _unreadable]


@pytest.mark.parametrize("make", REFUSED, ids=[m.__name__.strip("_") for m in REFUSED])
def test_a_bundle_that_is_not_the_registrys_is_never_handed_to_vllm(loads, make):
    checks, adapters, registry = loads
    path = make(adapters, registry)
    with pytest.raises(verified_load.Refused):
        checks.copy(NAME, str(path))
    assert list(Path(checks.load_dir).iterdir()) == []


def test_an_outage_reloads_only_what_this_process_loaded_before_against_its_digests(loads):
    checks, adapters, registry = loads
    path, digests = _bundle(adapters, "v1")
    other, other_digests = _bundle(adapters, "v2", b"other weights")
    registry.answers[(NAME, "v1")] = digests
    checks.copy(NAME, str(path))
    registry.answers[(NAME, "v1")] = registry.answers[(NAME, "v2")] = registry_reader.NotServable(
        "down", "registry_unavailable"
    )
    assert Path(checks.copy(NAME, str(path))).is_dir()  # an evicted adapter comes back
    with pytest.raises(verified_load.Refused):
        checks.copy(NAME, str(other))  # never loaded here: nothing to check it against
    (path / "adapter_model.safetensors").write_bytes(b"swapped during the outage")
    with pytest.raises(verified_load.Refused):
        checks.copy(NAME, str(path))
