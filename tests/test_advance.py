"""The pipeline is level-triggered too (issue 18): whatever event was lost or whichever
trigger's action failed, the ``advance`` sweep reads from the registry which versions wait
between gates and starts the run each one's event would have started -- once: a live run
with the same parameters is left alone, and a run that ended lets the next sweep start
another.

What waits where is a table of registry states (SQLite and Postgres); the sweep runs
against a real Prefect API with the gates' deployments registered, and what it starts is
read back from that API.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from loragate.registry.records.progress import Gate, Waiting
from loragate.registry.service import Registry
from loragate.tasks.advance import DEPLOYMENTS, advance, plan_nudges, versions_with_live_runs
from tests.support.moves import promote
from tests.support.registries import mark_ready, mark_validated

NAME = "acme/tiny-llama/support"
OTHER = "acme/tiny-llama/billing"


def _registered(r: Registry, bundles) -> dict[str, str]:
    return {"v1": r.register_adapter(bundles[0], NAME).version.version_id}


def _validated(r: Registry, bundles) -> dict[str, str]:
    found = _registered(r, bundles)
    mark_validated(r, found["v1"])
    return found


def _two_validated(r: Registry, bundles) -> dict[str, str]:
    found = _validated(r, bundles)
    found["v2"] = r.register_adapter(bundles[1], NAME).version.version_id
    mark_validated(r, found["v2"])
    return found


def _failed(r: Registry, bundles) -> dict[str, str]:
    found = _registered(r, bundles)
    mark_validated(r, found["v1"], passed=False)
    return found


def _on_canary(r: Registry, bundles) -> dict[str, str]:
    found = _validated(r, bundles)
    promote(r, found["v1"], "canary")
    r.open_canary_window(found["v1"])
    return found


def _ready(r: Registry, bundles) -> dict[str, str]:
    found = _validated(r, bundles)
    promote(r, found["v1"], "canary")
    window, _ = r.open_canary_window(found["v1"])
    mark_ready(r, window.id)
    return found


def _in_production(r: Registry, bundles) -> dict[str, str]:
    found = _validated(r, bundles)
    promote(r, found["v1"], "canary")
    promote(r, found["v1"], "production")
    return found


# (case, how the registry is brought there, what waits: (gate, version label))
STATES: list[tuple[str, Callable, list[tuple[Gate, str]]]] = [
    ("registered", _registered, [(Gate.VALIDATE, "v1")]),
    ("validated", _validated, [(Gate.CANARY, "v1")]),
    ("two-validated-only-the-newest", _two_validated, [(Gate.CANARY, "v2")]),
    ("failed-validation", _failed, []),
    ("on-canary-window-open", _on_canary, []),
    ("window-ready", _ready, [(Gate.SIGN_OFF, "v1")]),
    ("in-production", _in_production, []),
]


@pytest.mark.parametrize("case, make, expected", STATES, ids=[s[0] for s in STATES])
def test_the_registry_says_which_gate_each_version_waits_for(cataloged, seeded_bundles, case, make, expected):
    registry, _ = cataloged
    versions = make(registry, seeded_bundles)
    waiting = registry.waiting()
    assert [(w.gate, w.version_id) for w in waiting] == [(g, versions[label]) for g, label in expected]
    assert all(w.adapter_name == NAME and w.base == "tiny-llama" for w in waiting)
    assert registry.waiting(longer_than_s=3600) == []  # none has waited that long


def _waiting(gate: Gate, version: str, base: str = "tiny-llama", holder: str | None = None) -> Waiting:
    return Waiting(gate, version, NAME, base, datetime.now(UTC), approval_flow_run_id=holder)


def test_one_validation_run_per_base_and_a_live_run_or_the_sign_offs_holder_is_left_alone():
    waiting = [
        _waiting(Gate.VALIDATE, "a"),
        _waiting(Gate.VALIDATE, "b"),  # same base: the run started for "a" validates it too
        _waiting(Gate.VALIDATE, "c", base="other-base"),
        _waiting(Gate.CANARY, "d"),
        _waiting(Gate.SIGN_OFF, "e", holder="run-e"),  # paused in the run that claimed it
        _waiting(Gate.SIGN_OFF, "f", holder="run-gone"),  # its run ended: a new one is needed
    ]
    live = {
        DEPLOYMENTS[Gate.CANARY]: [({"version_id": "d"}, "run-d")],
        DEPLOYMENTS[Gate.SIGN_OFF]: [({"version_id": "e"}, "run-e")],
    }
    actions = [(n.waiting.version_id, n.action, n.flow_run_id) for n in plan_nudges(waiting, live)]
    assert actions == [
        ("a", "start", None),
        ("b", "covered", None),
        ("c", "start", None),
        ("d", "running", "run-d"),
        ("e", "running", "run-e"),
        ("f", "start", None),
    ]


@pytest.fixture
def deployed(prefect_harness):
    """The gates' deployments on a real Prefect API (no worker: runs stay scheduled)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        ids = []
        for name in DEPLOYMENTS.values():
            flow_name, deployment = name.split("/")
            flow_id = client.create_flow_from_name(flow_name)
            ids.append(client.create_deployment(flow_id=flow_id, name=deployment))
        yield client
        for deployment_id in ids:  # the API is the session's: the next test starts from none
            for run in _runs_of(client, deployment_id):
                client.delete_flow_run(run.id)
            client.delete_deployment(deployment_id)


def _runs_of(client, deployment) -> list:
    """The runs of a deployment, by name or id."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    found = client.read_deployment_by_name(deployment).id if isinstance(deployment, str) else deployment
    return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[found])))


def test_the_sweep_starts_what_lost_events_would_have_and_never_a_second_live_run(
    deployed, registry, tiny_base, seeded_bundles
):
    from prefect.states import Cancelled

    registry.add_base(str(tiny_base), "tiny-llama")
    staged = registry.register_adapter(seeded_bundles[0], NAME).version.version_id  # validation event lost
    validated = registry.register_adapter(seeded_bundles[1], OTHER).version.version_id
    mark_validated(registry, validated)  # canary event lost

    nudges = advance(registry, after_s=0, alert_s=3600)
    assert [(n.waiting.version_id, n.action) for n in nudges] == [(staged, "started"), (validated, "started")]
    validations = _runs_of(deployed, DEPLOYMENTS[Gate.VALIDATE])
    canaries = _runs_of(deployed, DEPLOYMENTS[Gate.CANARY])
    assert [r.parameters for r in validations] == [{"base": "tiny-llama"}]
    assert [r.parameters for r in canaries] == [{"version_id": validated}]
    assert all("advance" in r.tags for r in validations + canaries)
    assert not any(n.alert for n in nudges)

    # the runs are still scheduled (no worker here): a second sweep starts nothing
    again = advance(registry, after_s=0, alert_s=0)
    assert [(n.action, n.flow_run_id) for n in again] == [
        ("running", str(validations[0].id)),
        ("running", str(canaries[0].id)),
    ]
    assert all(n.alert for n in again)  # waiting longer than alert_s = 0: reported
    assert len(_runs_of(deployed, DEPLOYMENTS[Gate.CANARY])) == 1

    # the canary run ended without deploying (crashed, cancelled): the next sweep starts one
    deployed.set_flow_run_state(canaries[0].id, Cancelled(), force=True)
    third = advance(registry, after_s=0, alert_s=3600)
    assert [n.action for n in third] == ["running", "started"]
    assert len(_runs_of(deployed, DEPLOYMENTS[Gate.CANARY])) == 2
    # and nothing waiting less than the setting is touched
    assert advance(registry, after_s=3600, alert_s=3600) == []


def test_the_versions_with_a_live_canary_run_are_those_its_scheduled_running_and_paused_runs_name(deployed):
    from prefect.states import Cancelled, Completed, Paused, Running

    canary = deployed.read_deployment_by_name(DEPLOYMENTS[Gate.CANARY]).id
    validate = deployed.read_deployment_by_name(DEPLOYMENTS[Gate.VALIDATE]).id
    runs = {
        state: deployed.create_flow_run_from_deployment(canary, parameters={"version_id": f"v-{state}"})
        for state in ("scheduled", "running", "paused", "completed", "cancelled")
    }
    deployed.create_flow_run_from_deployment(validate, parameters={"base": "tiny-llama"})
    for state, make in (("running", Running), ("paused", Paused), ("completed", Completed), ("cancelled", Cancelled)):
        deployed.set_flow_run_state(runs[state].id, make(), force=True)

    assert versions_with_live_runs(Gate.CANARY) == {"v-scheduled", "v-running", "v-paused"}
    assert versions_with_live_runs(Gate.VALIDATE) == set()  # its runs name a base, not a version


def test_loragate_status_lists_what_waits_and_flags_what_is_stuck(catalogued_cli, seeded_bundles):
    assert catalogued_cli("status").stdout.strip() == "no version waits between gates"
    registered = catalogued_cli("register", str(seeded_bundles[0]), "--name", NAME, "--json")
    version = json.loads(registered.stdout)["version_id"]
    shown = catalogued_cli("status", "--json")
    assert shown.returncode == 0, shown.stderr
    (row,) = json.loads(shown.stdout)["waiting"]
    assert (row["gate"], row["version_id"], row["stuck"]) == ("shadow-validate", version, False)
    assert json.loads(catalogued_cli("status", "--longer-than", "3600", "--json").stdout) == {
        "waiting": [],
        "alerts": [],
    }
    text = catalogued_cli("status").stdout
    assert version in text and "waits for shadow-validate" in text and "STUCK" not in text
