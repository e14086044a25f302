"""prefect.yaml's triggers checked against the events the pipeline really emits.

The gates chain by events (README.md#the-pipeline): a trigger that expects a
misspelt event, matches another resource, or passes on a payload field the event does not
carry is accepted by ``prefect deploy`` and then never fires, or starts a flow with empty
parameters. Each trigger is parsed the way ``prefect deploy`` parses it and judged with
Prefect's own matcher against the event as ``flows/events.py`` emits it (caught before it
leaves); what payload the flows announce each event with is read from ``flows/``.
"""

from __future__ import annotations

import ast
import copy
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path
from unittest import mock

import pytest
import yaml
from prefect.events import DeploymentTriggerTypes
from prefect.server.events.schemas.automations import EventTrigger as ServerEventTrigger
from prefect.server.events.schemas.events import ReceivedEvent
from pydantic import TypeAdapter

from loragate.flows import events

ROOT = Path(__file__).resolve().parents[1]
PREFECT_YAML = ROOT / "prefect.yaml"
NAME = "acme/tiny-llama/support"

# The chain of gates, written out from the README's pipeline diagram: each event that starts
# the next gate, and that gate's deployment.
CHAIN = {
    events.TRAINING_COMPLETED: "register",
    events.REGISTERED: "shadow-validate",
    events.VALIDATED: "canary",
    events.CANARY_READY: "promote",
}
# announced for people (Slack, the UI, other automations); no deployment of ours waits for them
NOTICES = {
    events.REJECTED,
    events.VALIDATION_FAILED,
    events.CANARY_STARTED,
    events.CANARY_ROLLED_BACK,
    events.CANARY_UNDECIDED,
    events.CANARY_OVERRIDDEN,
    events.SIGNOFF_REJECTED,
    events.PROMOTED,
    events.ROLLED_BACK,
}
TRIGGER = TypeAdapter(DeploymentTriggerTypes)  # what `prefect deploy` validates a trigger spec with
PAYLOAD_FIELD = re.compile(r"\{\{\s*event\.payload\.(\w+)\s*\}\}")


def load_config(text: str | None = None) -> dict:
    return yaml.safe_load(PREFECT_YAML.read_text() if text is None else text)


def defined_events() -> set[str]:
    """The event names flows/events.py defines: its upper-case string constants."""
    return {value for key, value in vars(events).items() if key.isupper() and isinstance(value, str)}


def as_emitted(event: str) -> ReceivedEvent:
    """``event`` as flows/events.py emits it -- resource and payload -- caught before it leaves."""
    caught: list[dict] = []
    with mock.patch.object(events, "emit_event", lambda **kw: caught.append(kw)):
        if event == events.TRAINING_COMPLETED:
            events.announce_training_completed("s3://bundles/support", NAME)
        else:
            events.announce(event, NAME)
    [sent] = caught
    return ReceivedEvent(
        occurred=datetime.now(UTC),
        event=sent["event"],
        resource=sent["resource"],
        payload=sent["payload"],
        id=uuid.uuid4(),
    )


def _event_named(node: ast.expr) -> str | None:
    """``events.X`` or ``X`` as the value of flows/events.py's constant X."""
    attr = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
    value = getattr(events, attr, None) if attr else None
    return value if isinstance(value, str) else None


def announced_payloads() -> dict[str, set[str]]:
    """For each event some flow announces, the payload fields every one of its
    ``events.announce(EVENT, name, **fields)`` calls in flows/ sends."""
    sent: dict[str, set[str]] = {}
    for path in sorted((ROOT / "loragate" / "flows").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            func = node.func if isinstance(node, ast.Call) else None
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
            if called != "announce" or not node.args or (event := _event_named(node.args[0])) is None:
                continue
            fields = {"name"} | {kw.arg for kw in node.keywords if kw.arg is not None}
            sent[event] = sent[event] & fields if event in sent else fields
    return sent


def payload_fields(event: str) -> set[str] | None:
    """What ``event`` carries when it arrives; None when nothing in loragate emits it. The
    training event comes from a training job through announce_training_completed."""
    if event == events.TRAINING_COMPLETED:
        return set(as_emitted(event).payload)
    return announced_payloads().get(event)


def deployment_triggers(config: dict) -> list[tuple[str, dict, ServerEventTrigger]]:
    """(deployment, trigger spec, the trigger as the server evaluates it) for every trigger."""
    found = []
    for deployment in config.get("deployments", []):
        for spec in deployment.get("triggers") or []:
            parsed = TRIGGER.validate_python(dict(spec))
            dumped = parsed.model_dump(mode="json")
            server = ServerEventTrigger.model_validate(
                {k: v for k, v in dumped.items() if k in ServerEventTrigger.model_fields}
            )
            found.append((deployment["name"], spec, server))
    return found


def expectation_problems(config: dict) -> list[str]:
    """A trigger expects only events flows/events.py defines, each the link of the chain that
    starts its deployment, and fires on that event as emitted (its ``match`` included)."""
    problems = []
    for deployment, _, trigger in deployment_triggers(config):
        for expected in sorted(trigger.expect | trigger.after):
            if expected not in defined_events():
                problems.append(f"{deployment}: expects {expected!r}, which flows/events.py does not define")
            elif CHAIN.get(expected) != deployment:
                problems.append(f"{deployment}: expects {expected!r}, which chains to {CHAIN.get(expected)!r}")
            elif not trigger.covers(as_emitted(expected)):
                problems.append(f"{deployment}: does not fire on {expected!r} as flows emit it ({trigger.match})")
    return problems


def chain_problems(config: dict) -> list[str]:
    """Every link of the chain starts its gate: the gate's deployment has a trigger that
    fires on the event as emitted."""
    triggers = deployment_triggers(config)
    return [
        f"{deployment}: no trigger fires on {event!r}, the event it is chained on"
        for event, deployment in CHAIN.items()
        if not any(name == deployment and trigger.covers(as_emitted(event)) for name, _, trigger in triggers)
    ]


def parameter_problems(config: dict) -> list[str]:
    """Every ``{{ event.payload.X }}`` a trigger passes to its flow is a field the event it
    expects is announced with."""
    problems = []
    for deployment, spec, trigger in deployment_triggers(config):
        wanted = sorted({f for value in (spec.get("parameters") or {}).values() for f in PAYLOAD_FIELD.findall(value)})
        for expected in sorted(trigger.expect & defined_events()):
            carried = payload_fields(expected)
            if carried is None:
                problems.append(f"{deployment}: waits for {expected!r}, which nothing in loragate announces")
                continue
            problems += [
                f"{deployment}: passes event.payload.{field}, which {expected!r} does not carry"
                for field in wanted
                if field not in carried
            ]
    return problems


def test_every_trigger_in_prefect_yaml_expects_an_event_flows_events_defines_and_fires_on_it_as_emitted():
    assert expectation_problems(load_config()) == []


def test_every_event_the_pipeline_chains_on_starts_its_next_gate_by_a_trigger():
    assert chain_problems(load_config()) == []


def test_every_payload_field_a_trigger_passes_to_its_flow_is_one_the_event_is_announced_with():
    assert parameter_problems(load_config()) == []


def test_every_event_flows_events_defines_is_either_a_link_of_the_chain_or_a_notice():
    """A new event is a decision: does a gate wait for it (a trigger, and CHAIN above) or not."""
    assert CHAIN.keys() & NOTICES == set()
    assert defined_events() == CHAIN.keys() | NOTICES


def test_the_chain_starts_with_the_one_event_loragate_does_not_emit_itself():
    """A training job announces its bundle; every later link is announced by a flow."""
    announced = announced_payloads()
    assert events.TRAINING_COMPLETED not in announced
    assert [e for e in CHAIN if e not in announced] == [events.TRAINING_COMPLETED]


def _misspell_an_event(text: str) -> str:
    assert text.count("- loragate.adapter.registered\n") == 1
    return text.replace("- loragate.adapter.registered\n", "- loragate.adapter.registerd\n")


def _drop_the_promote_trigger(config: dict) -> None:
    [promote] = [d for d in config["deployments"] if d["name"] == "promote"]
    del promote["triggers"]


def _match_another_resource(config: dict) -> None:
    [canary] = [d for d in config["deployments"] if d["name"] == "canary"]
    canary["triggers"][0]["match"] = {"prefect.resource.id": "loragate.training.*"}


def _misspell_a_payload_field(config: dict) -> None:
    [canary] = [d for d in config["deployments"] if d["name"] == "canary"]
    canary["triggers"][0]["parameters"]["version_id"] = "{{ event.payload.versionid }}"


def _trigger_on_a_notice(config: dict) -> None:
    [rollback] = [d for d in config["deployments"] if d["name"] == "rollback"]
    rollback["triggers"] = [{"type": "event", "expect": [events.CANARY_ROLLED_BACK]}]


@pytest.mark.parametrize(
    "mutate, flagged",
    [
        (_misspell_an_event, {"expectation": ["shadow-validate"], "chain": ["shadow-validate"], "parameter": []}),
        (_drop_the_promote_trigger, {"expectation": [], "chain": ["promote"], "parameter": []}),
        (_match_another_resource, {"expectation": ["canary"], "chain": ["canary"], "parameter": []}),
        (_misspell_a_payload_field, {"expectation": [], "chain": [], "parameter": ["canary"]}),
        (_trigger_on_a_notice, {"expectation": ["rollback"], "chain": [], "parameter": []}),
    ],
    ids=["misspelt-event", "missing-trigger", "other-resource", "misspelt-payload-field", "trigger-on-a-notice"],
)
def test_the_trigger_checks_flag_a_broken_copy_of_prefect_yaml(mutate, flagged):
    """The checks above can fail: each breakage of a copy of prefect.yaml is named, by the
    check it belongs to, at the deployment it breaks."""
    if mutate is _misspell_an_event:
        config = load_config(mutate(PREFECT_YAML.read_text()))
    else:
        config = copy.deepcopy(load_config())
        mutate(config)
    found = {
        "expectation": expectation_problems(config),
        "chain": chain_problems(config),
        "parameter": parameter_problems(config),
    }
    assert {kind: [p.split(":")[0] for p in problems] for kind, problems in found.items()} == flagged, found
