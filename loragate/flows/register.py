"""The register gate, triggered by ``loragate.training.completed``.

Registers the bundle (idempotent: the same bytes again return the same version) and
announces the outcome: ``loragate.adapter.registered``, which triggers shadow validation of
the base's pending versions, or ``loragate.adapter.rejected`` with the error code and field,
a Slack message, and the diagnostic as a Prefect artifact; the run then fails with it as
its state message.
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.artifacts import create_markdown_artifact
from prefect.states import Failed, State

from loragate.flows import events
from loragate.registry.errors import InvalidInput
from loragate.tasks import notify
from loragate.tasks.gates import register_bundle
from loragate.tasks.naming import artifact_key
from loragate.tasks.notify_task import notify_task


@flow(name="register", log_prints=True)
def register_flow(
    bundle: str, name: str, training: dict[str, Any] | None = None, golden_set: str | None = None
) -> str | State:
    try:
        registered = register_bundle(bundle, name, golden_set or None)
    except InvalidInput as e:
        events.announce(events.REJECTED, name, bundle=bundle, code=e.code.value, field=e.field, message=e.message)
        notify_task(notify.rejected(name, e.code.value, e.field, e.message))
        create_markdown_artifact(
            key=artifact_key("rejected", name),
            markdown=f"## Rejected: `{name}`\n\nBundle `{bundle}`\n\n**{e.code.value}** in `{e.field}`: {e.message}",
            description=f"{name} rejected at register: {e.code.value} [{e.field}]",
        )
        # the run fails with the one line a person needs, where the UI shows a state's message
        return Failed(message=f"rejected: {e.one_line()}")
    events.announce(
        events.REGISTERED,
        name,
        version_id=registered["version_id"],
        base=registered["base"],
        created=registered["created"],
        training=training or {},
    )
    return str(registered["version_id"])
