"""Pinned adapters in the registry (SQLite and Postgres): a person's pin is idempotent, an
unknown name is refused naming it, every change is audited; replacing the hot pins never
touches a person's, and two replacements at once leave one of the two sets, never a mix and
never an error; the residency plan counts the pins production serves, so a production replica
too small for them is refused at ``fleet add``. The CLI's exit codes too."""

from __future__ import annotations

import json
import threading

import pytest

from loragate.registry.errors import ErrorCode, InvalidInput, NotFound
from loragate.registry.rules.pinning import PinSource
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from tests.support.moves import promote
from tests.support.registries import IN_PROCESS, audit_count, mark_validated

NAMES = [f"acme/tiny-llama/{task}" for task in ("support", "tickets", "billing", "search")]
NOBODY = "acme/tiny-llama/nobody"


@pytest.fixture
def named(cataloged, seeded_bundles) -> Registry:
    """A version of each of NAMES registered, none in production."""
    registry, _ = cataloged
    for bundle, name in zip(seeded_bundles, NAMES, strict=True):
        registry.register_adapter(bundle, name)
    return registry


@pytest.fixture
def roomy(named, tmp_path) -> Registry:
    """``named`` with a production replica of room for the setting's 10 hot pins: no hot pin
    goes in without one (the limit, in the database too since migration 0016)."""
    named.add_replica("http://10.0.0.9:8000", "tiny-llama", "production", str(tmp_path), max_loras=32)
    return named


def in_production(registry: Registry, name: str) -> str:
    [version] = [v.version_id for v in registry.list_versions(name)]
    mark_validated(registry, version)
    promote(registry, version, "canary")
    promote(registry, version, "production")
    return version


def sources(registry: Registry) -> dict[str, str]:
    return {p.name: p.source.value for p in registry.pins()}


def test_pinning_twice_pins_once_and_audits_once(named):
    pin, changed = named.pin(NAMES[0])
    assert changed and (pin.name, pin.source, pin.pinned_by) == (NAMES[0], PinSource.OPERATOR, "tester")
    after = audit_count(named)
    again, changed = named.pin(NAMES[0])
    assert not changed and again == pin and audit_count(named) == after
    assert named.pins() == [pin]
    [event] = [e for e in named.history(NAMES[0]) if e.action == "pin"]
    assert (event.actor, event.from_value, event.to_value) == ("tester", None, "operator")


@pytest.mark.parametrize(
    "name, code",
    [(NOBODY, ErrorCode.UNKNOWN_ADAPTER), ("not-a-name", ErrorCode.INVALID_NAME)],
    ids=["unknown", "malformed"],
)
def test_a_name_the_registry_does_not_know_is_refused_naming_it(named, name, code):
    before = audit_count(named)
    for act in (named.pin, named.unpin):
        with pytest.raises(InvalidInput) as refused:
            act(name)
        assert (refused.value.code, refused.value.field) == (code, "name") and name in refused.value.message
    assert named.pins() == [] and audit_count(named) == before


def test_unpin_removes_a_persons_or_a_hot_pin_and_refuses_one_not_pinned(roomy):
    roomy.pin(NAMES[0])
    roomy.replace_hot_pins([NAMES[1]])
    assert roomy.unpin(NAMES[0]).source == PinSource.OPERATOR
    assert roomy.unpin(NAMES[1]).source == PinSource.HOT
    assert roomy.pins() == []
    with pytest.raises(NotFound) as refused:
        roomy.unpin(NAMES[0])
    assert (refused.value.code, refused.value.field) == (ErrorCode.NOT_FOUND, "name")
    assert [e.action for e in roomy.history(NAMES[1]) if e.action in ("pin", "unpin")] == ["pin", "unpin"]


def test_replacing_the_hot_pins_never_touches_a_persons(roomy):
    roomy.pin(NAMES[0])
    assert roomy.replace_hot_pins([NAMES[0], NAMES[1]]) == ([NAMES[1]], [])
    assert sources(roomy) == {NAMES[0]: "operator", NAMES[1]: "hot"}
    assert roomy.replace_hot_pins([NAMES[2]]) == ([NAMES[2]], [NAMES[1]])
    assert roomy.replace_hot_pins([NAMES[2]]) == ([], [])  # the same set: nothing written
    assert roomy.replace_hot_pins([]) == ([], [NAMES[2]])
    assert sources(roomy) == {NAMES[0]: "operator"}
    before = audit_count(roomy)
    with pytest.raises(NotFound) as refused:
        roomy.replace_hot_pins([NAMES[3], NOBODY])
    assert (refused.value.code, refused.value.field) == (ErrorCode.UNKNOWN_ADAPTER, "name") and NOBODY in str(
        refused.value
    )
    assert sources(roomy) == {NAMES[0]: "operator"} and audit_count(roomy) == before


def test_a_person_pinning_a_hot_adapter_makes_the_pin_theirs(roomy):
    roomy.replace_hot_pins([NAMES[0]])
    pin, changed = roomy.pin(NAMES[0])
    assert changed and pin.source == PinSource.OPERATOR
    assert roomy.replace_hot_pins([]) == ([], [])
    assert sources(roomy) == {NAMES[0]: "operator"}
    events = [(e.action, e.from_value, e.to_value) for e in roomy.history(NAMES[0]) if e.action == "pin"]
    assert events == [("pin", None, "hot"), ("pin", "hot", "operator")]


def test_two_replacements_at_once_leave_one_of_the_two_sets(roomy):
    """Each round two registries (connections of their own) replace the hot set at once:
    the database serialises them, so the set left is either one, never a mix."""
    others = [Registry.open(roomy.settings, principal=IN_PROCESS) for _ in range(2)]
    sets = [sorted(NAMES[:2]), sorted(NAMES[2:])]
    try:
        for round_ in range(8):
            roomy.replace_hot_pins(sets[round_ % 2] + [NAMES[round_ % 4]])
            barrier = threading.Barrier(2)
            errors: list[BaseException] = []

            def replace(registry: Registry, names: list[str], barrier=barrier, errors=errors) -> None:
                barrier.wait()
                try:
                    registry.replace_hot_pins(names)
                except BaseException as e:  # noqa: BLE001 (the assertion below names it)
                    errors.append(e)

            threads = [threading.Thread(target=replace, args=(r, s)) for r, s in zip(others, sets, strict=True)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            assert sorted(sources(roomy)) in sets, f"round {round_}: a mix"
    finally:
        for registry in others:
            registry.close()


def test_the_plan_counts_the_pins_production_serves_and_fleet_add_refuses_a_replica_too_small(named, tmp_path):
    for name in NAMES[:3]:
        in_production(named, name)
    named.add_replica("http://10.0.0.1:8000", "tiny-llama", "production", str(tmp_path), max_loras=4)
    named.pin(NAMES[0])
    named.replace_hot_pins([NAMES[1]])
    named.pin(NAMES[3])  # not in production: it takes no slot yet
    plan = named.residency_plan("tiny-llama", memory=False)
    assert (plan.pinned, len(plan.warm), plan.floor) == (2, 0, 2)
    assert named.residency_plan("tiny-llama", role="canary", memory=False).pinned == 0
    before = audit_count(named)
    with pytest.raises(InvalidInput) as refused:
        named.add_replica("http://10.0.0.2:8000", "tiny-llama", "production", str(tmp_path), max_loras=1)
    assert (refused.value.code, refused.value.field) == (ErrorCode.INVALID_SETTING, "max_loras")
    assert "2 pinned + 0 warm" in refused.value.message and "not added" in refused.value.message
    assert [r.url for r in named.list_replicas()] == ["http://10.0.0.1:8000"] and audit_count(named) == before
    named.add_replica("http://10.0.0.3:8000", "tiny-llama", "canary", str(tmp_path), max_loras=1)  # pins nothing
    named.add_replica("http://10.0.0.2:8000", "tiny-llama", "production", str(tmp_path), max_loras=2)
    assert named.hot_pin_limits() == {"tiny-llama": 1}  # 2 slots - 0 warm - 1 free
    named.unpin(NAMES[0])
    assert named.residency_plan("tiny-llama", memory=False).pinned == 1


def test_the_limit_is_the_setting_when_the_replicas_have_room(named, tmp_path):
    in_production(named, NAMES[0])
    assert named.hot_pin_limits() == {"tiny-llama": 0}  # no production replica: no room
    named.add_replica("http://10.0.0.2:8000", "tiny-llama", "production", str(tmp_path), max_loras=32)
    assert named.hot_pin_limits() == {"tiny-llama": 10}
    settings = named.settings.model_copy(update={"hot_pins": 0})
    with Registry.open(settings, principal=IN_PROCESS) as disabled:
        assert disabled.hot_pin_limits() == {"tiny-llama": 0}


# -- the command line (SQLite) ---------------------------------------------------------------


def test_fleet_pin_unpin_and_pins_exit_0_and_2_naming_the_name_and_3_for_the_fleet_role(
    catalogued_cli, tmp_path, seeded_bundles
):
    with Registry.open(Settings(home=tmp_path / "home"), principal=IN_PROCESS) as registry:
        registry.register_adapter(seeded_bundles[0], NAMES[0])
        _, fleet_token = registry.create_token("fleet", "fleet-worker")
    pinned = catalogued_cli("fleet", "pin", NAMES[0])
    assert pinned.returncode == 0 and pinned.stdout.strip() == f"pinned {NAMES[0]}", pinned.stderr
    assert catalogued_cli("fleet", "pin", NAMES[0]).stdout.strip() == f"already pinned {NAMES[0]}"
    [shown] = json.loads(catalogued_cli("fleet", "pins", "--json").stdout)
    assert (shown["name"], shown["source"]) == (NAMES[0], "operator") and shown["pinned_by"].startswith("admin-tests")
    for verb in ("pin", "unpin"):
        refused = catalogued_cli("fleet", verb, NOBODY)
        assert refused.returncode == 2, refused.stderr
        assert (
            refused.stderr.count("\n") == 1 and "unknown_adapter [name]" in refused.stderr and NOBODY in refused.stderr
        )
    denied = catalogued_cli("fleet", "unpin", NAMES[0], "--token", fleet_token)
    assert denied.returncode == 3 and denied.stderr.startswith("error: permission denied"), denied.stderr
    unpinned = catalogued_cli("fleet", "unpin", NAMES[0])
    assert unpinned.returncode == 0 and unpinned.stdout.strip() == f"unpinned {NAMES[0]} (was operator)"
    assert catalogued_cli("fleet", "pins").stdout.strip() == "(no pinned adapters)"
    not_pinned = catalogued_cli("fleet", "unpin", NAMES[0])
    assert not_pinned.returncode == 2 and "not_found [name]" in not_pinned.stderr
