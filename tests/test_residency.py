"""The residency plan: an adapter's memory is what its weights hold, computed from its
manifest and the pinned base's config.json; a base's replicas need slots for the pinned and
warm versions plus a working set, and a cache entry for every version they keep; a replica
that cannot hold its role's pinned and warm set, or a served rank, is refused at ``fleet
add`` with nothing added (SQLite and Postgres); ``fleet plan`` exits 0, 1 or 2; an empty
fleet starts replicas with the defaults it always had."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from loragate.registry.errors import ErrorCode, InvalidInput
from loragate.registry.intake.weights import read_header
from loragate.registry.rules.fleet import AdapterPointers, ReplicaRole
from loragate.registry.rules.residency import (
    BaseShape,
    Residence,
    ResidencyPlan,
    ResidentVersion,
    adapter_bytes,
    human_bytes,
    resident_set,
    slot_bytes,
)
from loragate.registry.service import Registry
from loragate.registry.settings import VLLM_LORA_RANKS, Settings
from tests.support.moves import promote
from tests.support.registries import IN_PROCESS, audit_count, mark_validated, open_sqlite_registry

NAME = "acme/tiny-llama/support"


def tiny_shape(tiny_base: Path) -> BaseShape:
    return BaseShape.from_config(json.loads((tiny_base / "config.json").read_text()))


# -- the memory formula -------------------------------------------------------------------------


def test_an_adapters_bytes_are_the_hand_computation_and_what_its_weights_hold(tiny_base, seeded_bundles):
    shape = tiny_shape(tiny_base)
    assert (shape.hidden_size, shape.intermediate_size, shape.num_layers) == (128, 256, 2)
    assert (shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.dtype_bytes) == (2, 2, 64, 4)
    # seeded bundles: rank 8 on q_proj and v_proj; 2 layers x 8 x ((128 + 128) + (128 + 128)) x 4 bytes
    by_hand = 2 * 8 * ((128 + 2 * 64) + (128 + 2 * 64)) * 4
    assert adapter_bytes(shape, 8, ("q_proj", "v_proj")) == by_hand == 32768
    tensors, _ = read_header(seeded_bundles[0] / "adapter_model.safetensors", field="weights")
    held = sum(math.prod(t.shape) * 4 for t in tensors.values())
    assert held == by_hand
    # a slot: every module of every layer at rank 16 -- q, k, v, o (128 + 128 each), gate, up, down (128 + 256)
    assert slot_bytes(shape, 16) == 2 * 16 * (4 * 256 + 3 * 384) * 4 == 278528
    assert human_bytes(32768) == "32.0 KiB" and human_bytes(278528) == "272.0 KiB" and human_bytes(512) == "512 B"


def test_a_regular_expression_target_counts_the_module_paths_it_matches(tiny_base):
    shape = tiny_shape(tiny_base)
    every_layer = adapter_bytes(shape, 8, ("q_proj",))
    assert adapter_bytes(shape, 8, r".*\.q_proj") == every_layer
    assert adapter_bytes(shape, 8, r"model\.layers\.0\.self_attn\.q_proj") == every_layer // 2


@pytest.mark.parametrize(
    "targets, named",
    [(("q_proj", "lm_head"), "lm_head"), (("embed_tokens",), "embed_tokens"), (r".*\.c_attn", r".*\.c_attn")],
    ids=["one-unknown-among-known", "embedding", "regex-matching-nothing"],
)
def test_a_target_module_a_llama_layer_lacks_is_refused_naming_it(tiny_base, targets, named):
    with pytest.raises(InvalidInput) as err:
        adapter_bytes(tiny_shape(tiny_base), 8, targets)
    assert (err.value.code, err.value.field) == (ErrorCode.MANIFEST_MISMATCH, "target_modules")
    assert repr(named) in err.value.message


@pytest.mark.parametrize("missing", ["hidden_size", "num_hidden_layers", "intermediate_size"])
def test_a_config_without_a_dimension_is_refused_naming_the_key(tiny_base, missing):
    config = json.loads((tiny_base / "config.json").read_text())
    del config[missing]
    with pytest.raises(InvalidInput) as err:
        BaseShape.from_config(config)
    assert (err.value.code, err.value.field) == (ErrorCode.INVALID_BASE, missing)


# -- the plan's counts --------------------------------------------------------------------------


def fleet_of(production: int, *, windows: int = 0, previous: int = 0, idle_canaries: int = 0):
    """``production`` adapters; the first ``windows`` with a canary in an active window, the
    first ``previous`` with a previous production, the last ``idle_canaries`` with a canary
    whose window is not active."""
    adapters, active = [], {}
    for i in range(production):
        name = f"t{i}/tiny-llama/task"
        canary = f"c{i}" if i < windows or i >= production - idle_canaries else None
        if i < windows:
            active[name] = f"c{i}"
        adapters.append(AdapterPointers(name, "tiny-llama", canary, f"p{i}", f"old{i}" if i < previous else None))
    return adapters, active


def plan_of(adapters, windows, role=ReplicaRole.PRODUCTION, pinned=0, rank=8) -> ResidencyPlan:
    residents = tuple(ResidentVersion(n, v, r, rank, ("q_proj",)) for n, v, r in resident_set(role, adapters, windows))
    return ResidencyPlan("tiny-llama", role, residents, pinned=pinned, accepted_ranks=VLLM_LORA_RANKS)


PLANS = [
    # case, fleet, role, pinned, (served, warm, max_loras, max_cpu_loras)
    ("empty", fleet_of(0), ReplicaRole.PRODUCTION, 0, (0, 0, 0, 0)),
    ("one adapter: one working slot", fleet_of(1), ReplicaRole.PRODUCTION, 0, (1, 0, 1, 1)),
    ("eight: a quarter of them as working set", fleet_of(8), ReplicaRole.PRODUCTION, 0, (8, 0, 2, 8)),
    ("two canaries in windows, three previous", fleet_of(8, windows=2, previous=3), ReplicaRole.PRODUCTION, 0,
     (8, 5, 7, 13)),
    ("a canary out of its window is not warm", fleet_of(8, idle_canaries=2), ReplicaRole.PRODUCTION, 0, (8, 0, 2, 8)),
    ("two pinned of eight", fleet_of(8), ReplicaRole.PRODUCTION, 2, (8, 0, 4, 8)),
    ("every adapter pinned: no working set", fleet_of(3, previous=1), ReplicaRole.PRODUCTION, 3, (3, 1, 4, 4)),
    ("a hundred", fleet_of(100, windows=4, previous=10), ReplicaRole.PRODUCTION, 0, (100, 14, 39, 114)),
    ("canary replicas keep no warm copies", fleet_of(8, windows=2, previous=3), ReplicaRole.CANARY, 0, (8, 0, 2, 8)),
]  # fmt: skip


@pytest.mark.parametrize(("case", "fleet", "role", "pinned", "expected"), PLANS, ids=[p[0] for p in PLANS])
def test_the_plan_keeps_every_version_cached_and_slots_for_pinned_warm_and_a_working_set(
    case, fleet, role, pinned, expected
):
    plan = plan_of(*fleet, role=role, pinned=pinned)
    assert (len(plan.served), len(plan.warm), plan.max_loras, plan.max_cpu_loras) == expected
    assert plan.floor == pinned + len(plan.warm) <= plan.max_loras <= plan.max_cpu_loras


def test_warm_copies_are_the_versions_warm_versions_allows_beside_production():
    adapters, windows = fleet_of(2, windows=1, previous=1)
    assert resident_set(ReplicaRole.PRODUCTION, adapters, windows) == [
        ("t0/tiny-llama/task", "p0", Residence.SERVED),
        ("t0/tiny-llama/task", "c0", Residence.WARM),
        ("t0/tiny-llama/task", "old0", Residence.WARM),
        ("t1/tiny-llama/task", "p1", Residence.SERVED),
    ]


def test_an_empty_fleet_starts_replicas_with_the_defaults_it_always_had():
    assert plan_of(*fleet_of(0)).settings() == {"max_loras": 4, "max_cpu_loras": 16, "max_lora_rank": 16}
    # a plan asking more raises them; a rank above 16 rounds up to one vLLM accepts
    assert plan_of(*fleet_of(100), rank=24).settings() == {"max_loras": 25, "max_cpu_loras": 100, "max_lora_rank": 32}


@pytest.mark.parametrize(
    "max_loras, max_lora_rank, fields",
    [(5, 8, []), (4, 8, ["max_loras"]), (5, 1, ["max_lora_rank"]), (1, 1, ["max_loras", "max_lora_rank"])],
)
def test_a_replica_is_refused_below_pinned_plus_warm_slots_or_below_a_served_rank(max_loras, max_lora_rank, fields):
    plan = plan_of(*fleet_of(4, windows=2, previous=3))  # 5 warm
    assert [s.field for s in plan.refusals(max_loras, max_lora_rank)] == fields


def test_short_of_the_plan_is_more_than_refused_and_an_unknown_cache_is_not_checked():
    plan = plan_of(*fleet_of(8, windows=2))  # floor 2, needs 4, keeps 10
    assert [s.field for s in plan.shortfalls(3, 16, None)] == ["max_loras"]
    assert [s.field for s in plan.shortfalls(4, 16, 9)] == ["max_cpu_loras"]
    assert plan.shortfalls(4, 16, 10) == [] == plan.shortfalls(4, 16, None)


# -- the registry's plan and the fleet add refusal (SQLite and Postgres) -------------------------


def warm_fleet(registry: Registry, bundles) -> tuple[str, str, str]:
    """v2 in production, v1 its previous, v3 the canary of an active window: 2 warm copies."""
    v1, v2, v3 = (registry.register_adapter(b, NAME).version.version_id for b in bundles[:3])
    for v in (v1, v2, v3):
        mark_validated(registry, v)
    for v in (v1, v2):
        promote(registry, v, "canary")
        promote(registry, v, "production")
    promote(registry, v3, "canary")
    registry.open_canary_window(v3)
    return v1, v2, v3


def test_the_registrys_plan_sizes_each_kept_version_from_its_manifest_and_the_base(cataloged, seeded_bundles):
    registry, _ = cataloged
    v1, v2, v3 = warm_fleet(registry, seeded_bundles)
    plan = registry.residency_plan("tiny-llama")
    kept = {(r.version_id, r.residence, r.lora_rank, r.bytes) for r in plan.residents}
    assert kept == {(v2, Residence.SERVED, 8, 32768), (v1, Residence.WARM, 8, 32768), (v3, Residence.WARM, 8, 32768)}
    assert (plan.max_loras, plan.max_cpu_loras, plan.cpu_bytes, plan.slot_bytes(16)) == (3, 3, 98304, 278528)
    canary = registry.residency_plan("tiny-llama", role="canary")
    assert [(r.version_id, r.residence) for r in canary.residents] == [(v3, Residence.SERVED)]


@pytest.mark.parametrize(
    "limits, code, field",
    [
        ({"max_loras": 1}, ErrorCode.INVALID_SETTING, "max_loras"),
        ({"max_lora_rank": 1}, ErrorCode.RANK_LIMIT, "max_lora_rank"),
    ],
    ids=["too-few-slots", "rank-too-low"],
)
def test_a_production_replica_too_small_for_the_plan_is_refused_and_nothing_is_added(
    cataloged, seeded_bundles, tmp_path, limits, code, field
):
    registry, _ = cataloged
    warm_fleet(registry, seeded_bundles)
    before = audit_count(registry)
    with pytest.raises(InvalidInput) as err:
        registry.add_replica("http://10.0.0.2:8000", "tiny-llama", "production", str(tmp_path), **limits)
    assert (err.value.code, err.value.field) == (code, field)
    assert "\n" not in err.value.one_line() and "not added" in err.value.message
    assert registry.list_replicas() == [] and audit_count(registry) == before
    # two slots hold one previous and one canary: added
    registry.add_replica("http://10.0.0.2:8000", "tiny-llama", "production", str(tmp_path), max_loras=2)
    assert [r.max_loras for r in registry.list_replicas()] == [2]


def test_an_unpinned_base_has_no_plan(registry):
    with pytest.raises(InvalidInput) as err:
        registry.residency_plan("llama-70b")
    assert (err.value.code, err.value.field) == (ErrorCode.UNKNOWN_BASE, "base")


# -- the command line -----------------------------------------------------------------------------


def home_registry(tmp_path) -> Registry:
    return Registry.open(Settings(home=tmp_path / "home"), principal=IN_PROCESS)


def test_fleet_plan_of_an_empty_fleet_exits_0_with_the_old_defaults(catalogued_cli):
    shown = catalogued_cli("fleet", "plan")
    assert shown.returncode == 0, shown.stderr
    assert "--max-loras 4 --max-cpu-loras 16 --max-lora-rank 16" in shown.stdout
    [base] = json.loads(catalogued_cli("fleet", "plan", "--json").stdout)
    assert base["settings"] == {"max_loras": 4, "max_cpu_loras": 16, "max_lora_rank": 16}
    assert (base["max_loras"], base["max_cpu_loras"], base["replicas"]) == (0, 0, [])


def test_fleet_plan_exits_1_naming_the_replica_short_of_the_plan_and_why(catalogued_cli, tmp_path, seeded_bundles):
    with home_registry(tmp_path) as registry:
        warm_fleet(registry, seeded_bundles)
        registry.add_replica("http://10.0.0.2:8000", "tiny-llama", "production", str(tmp_path), max_loras=2)
        registry.add_replica("http://10.0.0.3:8000", "tiny-llama", "production", str(tmp_path), max_loras=3)
    shown = catalogued_cli("fleet", "plan", "--base", "tiny-llama")
    assert shown.returncode == 1, shown.stderr
    [short] = [line for line in shown.stdout.splitlines() if "does NOT hold it" in line]
    assert "http://10.0.0.2:8000" in short and "max_loras 2 < 3 needed" in short
    assert "max_cpu_loras not recorded in the fleet" in short
    [ok] = [line for line in shown.stdout.splitlines() if "http://10.0.0.3:8000" in line]
    assert ok.endswith("holds it")


@pytest.mark.parametrize(
    "argv, field",
    [
        (["fleet", "plan", "--base", "llama-70b"], "base"),
        (["fleet", "add", "http://10.0.0.2:8000", "--base", "tiny-llama", "--role", "production",
          "--adapter-dir", "/adapters", "--max-loras", "1"], "max_loras"),
        (["fleet", "add", "http://10.0.0.2:8000", "--base", "tiny-llama", "--role", "production",
          "--adapter-dir", "/adapters", "--max-lora-rank", "1"], "max_lora_rank"),
    ],
    ids=["plan-unpinned-base", "add-too-few-slots", "add-rank-too-low"],
)  # fmt: skip
def test_bad_input_exits_2_in_one_line_naming_the_field_and_adds_nothing(
    catalogued_cli, tmp_path, seeded_bundles, argv, field
):
    with home_registry(tmp_path) as registry:
        warm_fleet(registry, seeded_bundles)
    refused = catalogued_cli(*argv)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.count("\n") == 1 and f"[{field}]" in refused.stderr
    assert json.loads(catalogued_cli("fleet", "list", "--json").stdout) == []


def test_replicas_up_takes_its_slots_from_the_plan_unless_told(tmp_path, tiny_base, seeded_bundles):
    from loragate.cli.main import build_parser
    from loragate.cli.replicas import _slots

    def slots(registry, *options):
        args = build_parser().parse_args(["replicas", "up", "--base", "tiny-llama", *options])
        return _slots(registry, "tiny-llama", args)

    with open_sqlite_registry(tmp_path) as registry:
        registry.add_base(str(tiny_base), "tiny-llama")
        assert slots(registry) == (4, 16, 16)  # the defaults before plans
        warm_fleet(registry, seeded_bundles)
        assert slots(registry) == (4, 16, 16)  # 3 slots needed: still the defaults
        assert slots(registry, "--max-loras", "8") == (8, 32, 16)
        with pytest.raises(InvalidInput) as err:
            slots(registry, "--max-loras", "1")
        assert err.value.field == "max_loras" and "nothing was started" in err.value.message
