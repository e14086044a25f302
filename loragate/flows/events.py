"""The pipeline's events: what each gate announces, and what the next gate is triggered by.

Every event is about one logical adapter: its resource id is ``loragate.adapter.<name>``
(deployment triggers match ``loragate.adapter.*``), and its payload carries ids and names
only. ``loragate.training.completed`` is the one event loragate does not emit itself: a
training job does (``loragate emit-training`` does it from a shell).
"""

from __future__ import annotations

from typing import Any

from prefect.events import emit_event

TRAINING_COMPLETED = "loragate.training.completed"
REGISTERED = "loragate.adapter.registered"
REJECTED = "loragate.adapter.rejected"
VALIDATED = "loragate.adapter.validated"
VALIDATION_FAILED = "loragate.adapter.validation-failed"
CANARY_STARTED = "loragate.canary.started"
CANARY_READY = "loragate.canary.ready"
CANARY_ROLLED_BACK = "loragate.canary.rolled-back"
CANARY_UNDECIDED = "loragate.canary.undecided"
# a person promoted a canary to production before its window decided (``promote --override``)
CANARY_OVERRIDDEN = "loragate.canary.overridden"
SIGNOFF_REJECTED = "loragate.promotion.rejected"
PROMOTED = "loragate.adapter.promoted"
ROLLED_BACK = "loragate.adapter.rolled-back"


def adapter_resource(name: str) -> dict[str, str]:
    return {"prefect.resource.id": f"loragate.adapter.{name}", "prefect.resource.name": name}


def announce(event: str, name: str, **payload: Any) -> None:
    emit_event(event=event, resource=adapter_resource(name), payload={"name": name, **payload})


def announce_training_completed(
    bundle: str, name: str, training: dict[str, Any] | None = None, golden_set: str | None = None
) -> None:
    """What a training job emits when its bundle is written (a path or ``s3://`` prefix),
    optionally with the golden set the adapter is judged by."""
    emit_event(
        event=TRAINING_COMPLETED,
        resource={"prefect.resource.id": f"loragate.training.{name}", "prefect.resource.name": name},
        payload={"bundle": bundle, "name": name, "training": training or {}, "golden_set": golden_set or ""},
    )
