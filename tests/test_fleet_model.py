"""The fleet without replicas: the replicas table on SQLite and Postgres, the pure planning of
what each replica should serve and the resolver index built from it, and the pointer move
that stays unmoved when its fleet switch fails.

What the replicas themselves do is ``test_fleet.py``'s and ``test_reconcile.py``'s (real
vLLM); here a replica that cannot be reached is a closed port, which is real too. The
resolver plugin's reading of the index, and the index's concurrent writers, are
``test_resolver_index.py``'s.
"""

from __future__ import annotations

import json
import os
import socket

import pytest

from loragate.registry.errors import AlreadyExists, DeployFailed, ErrorCode, InvalidInput, NotFound
from loragate.registry.rules.fleet import (
    ActionKind,
    AdapterPointers,
    Replica,
    ReplicaRole,
    desired_placements,
    plan_reconcile,
    version_path,
)
from loragate.registry.storage.resolver_index import (
    INDEX_FILE,
    INDEX_FORMAT,
    build_index,
    index_entry,
    read_index,
    write_index,
)
from loragate.tasks.fleet import promote_and_switch, rollback_and_switch
from loragate.tasks.reconcile import fleet_status, reconcile_fleet
from tests.support.moves import promote
from tests.support.registries import audit_count, mark_validated

NAME = "acme/tiny-llama/support"


def closed_port_url() -> str:
    """A URL nothing listens on: connection refused, at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def replica(url="http://r1:8000", role=ReplicaRole.PRODUCTION, base="tiny-llama", adapter_dir="/adapters") -> Replica:
    return Replica(url, base, "c" * 40, role, adapter_dir, 16, 4, base)


# -- the replicas table ---------------------------------------------------------------------


def test_replicas_are_kept_per_base_listed_in_order_and_removed_by_url(cataloged, tmp_path):
    registry, _ = cataloged
    a, created = registry.add_replica("http://10.0.0.2:8000/", "tiny-llama", "production", str(tmp_path))
    assert created and a.url == "http://10.0.0.2:8000" and a.served_model_name == "tiny-llama"
    registry.add_replica("http://10.0.0.1:8000", "tiny-llama", "canary", str(tmp_path), max_lora_rank=32)
    again, created = registry.add_replica("http://10.0.0.2:8000", "tiny-llama", "production", str(tmp_path))
    assert not created and again.created_at == a.created_at
    assert [(r.url, r.role) for r in registry.list_replicas()] == [
        ("http://10.0.0.1:8000", ReplicaRole.CANARY),
        ("http://10.0.0.2:8000", ReplicaRole.PRODUCTION),
    ]
    assert registry.list_replicas("other-base") == []
    assert registry.remove_replica("http://10.0.0.1:8000").max_lora_rank == 32
    with pytest.raises(NotFound):
        registry.remove_replica("http://10.0.0.1:8000")
    assert [r.url for r in registry.list_replicas()] == ["http://10.0.0.2:8000"]


def test_the_same_url_with_another_configuration_is_refused(cataloged, tmp_path):
    registry, _ = cataloged
    registry.add_replica("http://10.0.0.2:8000", "tiny-llama", "production", str(tmp_path))
    with pytest.raises(AlreadyExists) as err:
        registry.add_replica("http://10.0.0.2:8000", "tiny-llama", "canary", str(tmp_path))
    assert err.value.field == "url"
    assert registry.list_replicas()[0].role == ReplicaRole.PRODUCTION


BAD_REPLICAS = [
    # (case, overrides of add_replica's arguments, code, field)
    ("not a url", {"url": "10.0.0.2:8000"}, ErrorCode.INVALID_SETTING, "url"),
    ("ftp scheme", {"url": "ftp://10.0.0.2:8000"}, ErrorCode.INVALID_SETTING, "url"),
    ("a path", {"url": "http://10.0.0.2:8000/v1"}, ErrorCode.INVALID_SETTING, "url"),
    ("a query", {"url": "http://10.0.0.2:8000/?x=1"}, ErrorCode.INVALID_SETTING, "url"),
    ("credentials", {"url": "http://user:pw@10.0.0.2:8000"}, ErrorCode.INVALID_SETTING, "url"),
    ("port not a number", {"url": "http://10.0.0.2:eighty"}, ErrorCode.INVALID_SETTING, "url"),
    ("no host", {"url": "http://:8000"}, ErrorCode.INVALID_SETTING, "url"),
    ("unknown role", {"role": "shadow"}, ErrorCode.INVALID_SETTING, "role"),
    ("rank vLLM does not take", {"max_lora_rank": 12}, ErrorCode.INVALID_SETTING, "max_lora_rank"),
    ("no adapter slots", {"max_loras": 0}, ErrorCode.INVALID_SETTING, "max_loras"),
    ("empty adapter dir", {"adapter_dir": " "}, ErrorCode.INVALID_SETTING, "adapter_dir"),
    ("unpinned base", {"base_model_id": "llama-70b"}, ErrorCode.UNKNOWN_BASE, "base"),
    ("unpinned commit", {"base_model_commit": "f" * 40}, ErrorCode.UNKNOWN_BASE, "base"),
]


@pytest.mark.parametrize(("case", "overrides", "code", "field"), BAD_REPLICAS, ids=[c[0] for c in BAD_REPLICAS])
def test_a_bad_replica_is_refused_naming_the_field_and_writes_nothing(
    cataloged, tmp_path, case, overrides, code, field
):
    registry, _ = cataloged
    arguments = {
        "url": "http://10.0.0.2:8000",
        "base_model_id": "tiny-llama",
        "role": "production",
        "adapter_dir": str(tmp_path),
        **overrides,
    }
    keywords = {k: arguments.pop(k) for k in ("base_model_commit", "max_lora_rank", "max_loras") if k in arguments}
    audit_before = audit_count(registry)
    with pytest.raises(InvalidInput) as err:
        registry.add_replica(
            arguments["url"], arguments["base_model_id"], arguments["role"], arguments["adapter_dir"], **keywords
        )
    assert (err.value.code, err.value.field) == (code, field)
    assert registry.list_replicas() == [] and audit_count(registry) == audit_before


# -- what each replica should serve ------------------------------------------------------------


def test_canary_replicas_serve_the_canary_when_there_is_one_and_production_otherwise():
    adapters = [
        AdapterPointers("a/tiny-llama/x", "tiny-llama", canary="v2", production="v1"),
        AdapterPointers("b/tiny-llama/y", "tiny-llama", canary=None, production="v5"),
        AdapterPointers("c/tiny-llama/z", "tiny-llama", canary="v9", production=None),
        AdapterPointers("d/other/w", "other", canary=None, production="v7"),
    ]
    canary = desired_placements(replica(role=ReplicaRole.CANARY), adapters)
    production = desired_placements(replica(), adapters)
    assert {n: p.version_id for n, p in canary.items()} == {
        "a/tiny-llama/x": "v2",
        "b/tiny-llama/y": "v5",
        "c/tiny-llama/z": "v9",
    }
    assert {n: p.version_id for n, p in production.items()} == {"a/tiny-llama/x": "v1", "b/tiny-llama/y": "v5"}
    assert production["a/tiny-llama/x"].path == "/adapters/a/tiny-llama/x/v1"


def test_reconcile_plans_loads_switches_and_unloads_and_leaves_what_is_not_loragates():
    r = replica()
    desired = desired_placements(
        r,
        [
            AdapterPointers("a/tiny-llama/x", "tiny-llama", None, "v1"),
            AdapterPointers("b/tiny-llama/y", "tiny-llama", None, "v2"),
            AdapterPointers("c/tiny-llama/z", "tiny-llama", None, "v3"),
        ],
    )
    served = {
        "b/tiny-llama/y": "/adapters/b/tiny-llama/y/v2",  # in sync
        "c/tiny-llama/z": "/elsewhere/z",  # the right name from a path no version owns
        "d/tiny-llama/gone": "/adapters/d/tiny-llama/gone/v0",  # no pointer wants it
        "someone-elses-lora": "/models/lora",  # not a loragate name: never touched
        "e/other-base/q": "/adapters/e/other-base/q/v1",  # another base's name: not ours either
    }
    actions = {(a.kind, a.name) for a in plan_reconcile(r, desired, served)}
    assert actions == {
        (ActionKind.LOAD, "a/tiny-llama/x"),
        (ActionKind.SWITCH, "c/tiny-llama/z"),
        (ActionKind.UNLOAD, "d/tiny-llama/gone"),
    }


def test_the_index_holds_each_role_of_each_adapter_directory(tmp_path):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    replicas = [
        replica("http://a:1", ReplicaRole.CANARY, adapter_dir=one),
        replica("http://b:1", adapter_dir=one),
        replica("http://c:1", adapter_dir=two),
    ]
    adapters = [AdapterPointers(NAME, "tiny-llama", canary="v2", production="v1")]
    digests = {"v1": {"adapter_model.safetensors": "1" * 64}, "v2": {"adapter_model.safetensors": "2" * 64}}
    indexes = build_index(replicas, adapters, digests.__getitem__)
    assert indexes[one]["roles"] == {
        "canary": {NAME: {"version": "v2", "path": version_path(one, NAME, "v2"), "files": digests["v2"]}},
        "production": {NAME: {"version": "v1", "path": version_path(one, NAME, "v1"), "files": digests["v1"]}},
    }
    assert set(indexes[two]["roles"]) == {"production"}
    write_index(one, indexes[one])
    assert read_index(one) == indexes[one]
    assert os.listdir(one) == [INDEX_FILE]  # replaced at once: no temporary left beside it


# -- a pointer move and its fleet switch, together --------------------------------------------


def two_validated_versions(registry, bundles) -> tuple[str, str]:
    v1 = registry.register_adapter(bundles[0], NAME).version.version_id
    v2 = registry.register_adapter(bundles[1], NAME).version.version_id
    for v in (v1, v2):
        mark_validated(registry, v)
    return v1, v2


def test_with_no_replicas_promote_and_rollback_move_pointers_as_before(cataloged, seeded_bundles):
    registry, _ = cataloged
    v1, v2 = two_validated_versions(registry, seeded_bundles)
    for version in (v1, v2):
        for stage in ("canary", "production"):
            _, report = promote_and_switch(registry, version, stage)
            assert report == []
    rollback_and_switch(registry, NAME, "production")
    assert registry.get_adapter(NAME).production == v1
    assert not any(e.action == "deploy" for e in registry.history(NAME))


def test_a_replica_that_cannot_be_reached_leaves_the_pointer_and_the_index_unmoved(cataloged, seeded_bundles, tmp_path):
    registry, _ = cataloged
    v1, v2 = two_validated_versions(registry, seeded_bundles)
    promote(registry, v1, "canary")
    promote(registry, v1, "production")
    promote(registry, v2, "canary")
    url = closed_port_url()
    adapter_dir = tmp_path / "adapters"
    registry.add_replica(url, "tiny-llama", "production", str(adapter_dir))
    entry = index_entry(v1, "p1", registry.bundle_digests(v1))
    write_index(str(adapter_dir), {"format": INDEX_FORMAT, "roles": {"production": {NAME: entry}}})
    history_before = len(registry.history(NAME))
    with pytest.raises(DeployFailed) as err:
        promote_and_switch(registry, v2, "production")
    assert url in err.value.message and "replica_unavailable" in err.value.message
    assert registry.get_adapter(NAME).production == v1
    assert registry.get_version(v2).stage == "canary"
    assert len(registry.history(NAME)) == history_before
    assert read_index(str(adapter_dir))["roles"]["production"][NAME]["version"] == v1


def test_a_version_above_every_replicas_rank_limit_is_refused_before_any_replica_is_asked(
    cataloged, seeded_bundles, tmp_path
):
    registry, _ = cataloged
    v1, _ = two_validated_versions(registry, seeded_bundles)
    registry.add_replica(closed_port_url(), "tiny-llama", "canary", str(tmp_path), max_lora_rank=1)
    with pytest.raises(InvalidInput) as err:
        promote_and_switch(registry, v1, "canary")
    # refused on rank, not on the unreachable replica: nothing was asked of it
    assert err.value.code == ErrorCode.RANK_LIMIT and err.value.field == "lora_rank"
    assert registry.get_adapter(NAME).canary is None


def test_status_and_reconcile_report_an_unreachable_replica_and_go_on(cataloged, seeded_bundles, tmp_path):
    registry, _ = cataloged
    v1, _ = two_validated_versions(registry, seeded_bundles)
    promote(registry, v1, "canary")
    url = closed_port_url()
    registry.add_replica(url, "tiny-llama", "canary", str(tmp_path / "adapters"))
    [state] = fleet_status(registry)
    assert not state.reachable and "replica_unavailable" in state.error
    [state] = reconcile_fleet(registry)
    assert not state.reachable
    # the index is written anyway: when the replica comes back, its resolver serves the canary
    index = read_index(str(tmp_path / "adapters"))
    assert index["roles"]["canary"][NAME]["version"] == v1


# -- the CLI's face on it ---------------------------------------------------------------------


@pytest.fixture
def cli(catalogued_cli):
    return catalogued_cli


def test_fleet_commands_add_list_status_and_remove(cli, tmp_path):
    url = closed_port_url()
    added = cli(
        "fleet", "add", url, "--base", "tiny-llama", "--role", "canary", "--adapter-dir", str(tmp_path), "--json"
    )
    assert added.returncode == 0 and json.loads(added.stdout)["created"] is True
    listed = json.loads(cli("fleet", "list", "--json").stdout)
    assert [(r["url"], r["role"]) for r in listed] == [(url, "canary")]
    status = cli("fleet", "status", "--json")
    assert status.returncode == 0
    assert [(s["url"], s["reachable"]) for s in json.loads(status.stdout)] == [(url, False)]
    assert cli("fleet", "reconcile").returncode == 1  # a replica it could not reach
    assert cli("fleet", "remove", url).returncode == 0
    assert json.loads(cli("fleet", "list", "--json").stdout) == []


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["fleet", "add", "localhost:8000", "--base", "tiny-llama", "--role", "canary", "--adapter-dir", "/a"], "url"),
        (["fleet", "add", "http://h:1", "--base", "nope", "--role", "canary", "--adapter-dir", "/a"], "base"),
        (
            [
                "fleet",
                "add",
                "http://h:1",
                "--base",
                "tiny-llama",
                "--role",
                "canary",
                "--adapter-dir",
                "/a",
                "--max-lora-rank",
                "7",
            ],
            "max_lora_rank",
        ),
        (["fleet", "remove", "http://h:1"], "url"),
        (["replicas", "up", "--base", "nope"], "base"),
        (["replicas", "up", "--base", "tiny-llama", "--count", "0"], "count"),
    ],
)
def test_bad_fleet_input_exits_2_naming_the_field_in_one_line(cli, argv, field):
    result = cli(*argv)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and f"[{field}]" in result.stderr
    assert json.loads(cli("fleet", "list", "--json").stdout) == []
