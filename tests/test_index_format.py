"""The resolver index on disk has one format, read the same on both sides.

loragate writes the index (``loragate.registry.storage.resolver_index``) and the vLLM
resolver plugin reads it inside every replica (``infra/vllm_plugin``). The plugin runs in
vLLM's environment and imports nothing of loragate's, so the file name, the format number,
the empty index and the versions' paths are stated on both sides; this test is what keeps
them one format: each on-disk case below must read identically through both.
"""

from __future__ import annotations

import json

import pytest

from loragate.registry.rules.fleet import version_path
from loragate.registry.storage import resolver_index
from tests import test_resolver_index

# the plugin package as a replica imports it
resolver = test_resolver_index.resolver
NAME = "acme/tiny-llama/support"
ENTRY = {"version": "v1", "path": "/adapters/acme/tiny-llama/support/v1", "files": {"manifest.json": "ab" * 32}}


def test_both_sides_name_the_same_file_and_format(resolver):
    assert (resolver.INDEX_FILE, resolver.INDEX_FORMAT) == (resolver_index.INDEX_FILE, resolver_index.INDEX_FORMAT)


ON_DISK = [
    ("no index", None),
    ("not json", "{not json"),
    ("not an object", json.dumps([1, 2])),
    ("format 1, entries without digests", json.dumps({"format": 1, "roles": {"production": {NAME: ENTRY}}})),
    ("a later format", json.dumps({"format": resolver_index.INDEX_FORMAT + 1, "roles": {}})),
    ("no format", json.dumps({"roles": {"production": {NAME: ENTRY}}})),
    ("the current format", json.dumps({"format": resolver_index.INDEX_FORMAT, "roles": {"production": {NAME: ENTRY}}})),
    (
        "two roles",
        json.dumps({"format": resolver_index.INDEX_FORMAT, "roles": {"canary": {NAME: ENTRY}, "production": {}}}),
    ),
]


@pytest.mark.parametrize(("case", "content"), ON_DISK, ids=[c for c, _ in ON_DISK])
def test_an_index_on_disk_reads_the_same_through_loragate_and_the_plugin(resolver, tmp_path, case, content):
    if content is not None:
        (tmp_path / resolver_index.INDEX_FILE).write_text(content)
    ours = resolver_index.read_index(str(tmp_path))
    assert resolver.read_index(str(tmp_path)) == ours
    assert ours["format"] == resolver_index.INDEX_FORMAT  # a reader sees the current format or an empty index


def test_an_index_loragate_writes_is_what_the_plugin_reads(resolver, tmp_path):
    index = {"format": resolver_index.INDEX_FORMAT, "roles": {"production": {NAME: ENTRY}}}
    resolver_index.write_index(str(tmp_path), index)
    assert resolver.read_index(str(tmp_path)) == index


@pytest.mark.parametrize("name", [NAME, "solo", "a/b"])
def test_a_versions_path_is_laid_out_the_same_on_both_sides(resolver, name):
    assert resolver.version_path("/adapters", name, "v7") == version_path("/adapters", name, "v7")
