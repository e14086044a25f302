"""The story an adapter's audit log must tell: its pointer moves replayed in order, each from
the value the previous one left, ending on the stored pointers and stages -- a lost update
shows as two moves from the same value (``tests/test_race.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from loragate.registry.records.adapters import AuditEvent

POINTER_MOVES = ("promote", "rollback")


@dataclass
class Story:
    """An adapter's pointers and its versions' stages, as replayed from its audit events."""

    canary: str | None
    production: str | None
    previous: str | None
    stages: dict[str, str] = field(default_factory=dict)

    def pointers(self) -> dict[str, str | None]:
        return {"canary": self.canary, "production": self.production, "previous": self.previous}


def _check(ok: bool, event: AuditEvent, what: str) -> None:
    if not ok:
        raise AssertionError(
            f"audit event {event.id} ({event.action} {event.stage} {event.from_value} -> {event.to_value}, "
            f"{event.reason!r}) breaks the story: {what}"
        )


def replay(story: Story, events: list[AuditEvent]) -> Story:
    """Apply pointer-moving events in order to ``story`` (changed in place and returned).

    Every event must start from what the story holds at that moment -- a lost update shows
    as two moves from the same value -- and its stage changes must start from the stages
    the story holds; afterwards production names a production version and canary a canary.

    Raises:
        AssertionError: naming the first event that does not follow.
    """
    for e in events:
        _check(e.action in POINTER_MOVES, e, "not a pointer move")
        if e.action == "promote" and e.stage == "canary":
            _check(e.from_value == story.canary, e, f"the canary was {story.canary}")
            _check(e.to_value == e.version_id and e.to_value is not None, e, "promotes another version")
            story.canary = e.to_value
        elif e.action == "promote" and e.stage == "production":
            _check(e.from_value == story.production, e, f"production was {story.production}")
            _check(e.to_value == story.canary and e.to_value is not None, e, f"the canary was {story.canary}")
            if e.from_value is not None:
                story.previous = e.from_value
            story.production, story.canary = e.to_value, None
        elif e.action == "rollback" and e.stage == "production":
            _check(e.from_value == story.production, e, f"production was {story.production}")
            _check(e.to_value == story.previous and e.to_value is not None, e, f"previous was {story.previous}")
            story.production, story.previous = e.to_value, None
        elif e.action == "rollback" and e.stage == "canary":
            _check(e.from_value == story.canary and e.from_value is not None, e, f"the canary was {story.canary}")
            story.canary = None
        else:
            _check(False, e, f"unknown stage {e.stage!r}")
        for version, before, after in e.details.get("stage_changes", []):
            _check(story.stages.get(version) == before, e, f"{version} was {story.stages.get(version)}, not {before}")
            story.stages[version] = after
        for pointer in ("canary", "production"):
            held = story.pointers()[pointer]
            _check(
                held is None or story.stages.get(held) == pointer, e, f"{pointer} {held} is {story.stages.get(held)}"
            )
    return story
