"""No single replica's figures roll a version back.

The live verdict sums every production replica's figures. Each one's are signed by a holder
of the fleet's key, but a replica can still be wrong on its own -- a faulty host, a
compromised one, a misconfigured split -- and one replica's made-up failures would then
withdraw a good canary for everyone. So where a live rollback, or a live latency breach (which
counts toward the streak that rolls back), holds on the figures of every replica together,
it is judged again without each replica's in turn; if dropping one replica's figures undoes
it, it rests on that replica alone: it is held, not acted on -- reported on the observation
with the replica named, and the window is not ready while it lasts. A fleet of one
production replica has nothing to compare against and is taken as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from loragate.registry.rules.canary import LATENCY_MONITORS
from loragate.registry.rules.live import LiveJudgement


def needs_agreement(judgement: LiveJudgement, replicas: int) -> bool:
    """Whether ``judgement`` would act (a rollback, a latency breach) on figures of two or
    more replicas: only then is it judged again without each."""
    return replicas >= 2 and (judgement.rollback or judgement.latency_breach)


def judged_without_each(
    documents: Sequence[dict[str, Any]], judge: Callable[[list[dict[str, Any]]], LiveJudgement], key: str
) -> dict[str, LiveJudgement]:
    """Replica (its document's ``key``) -> ``judge`` of every other replica's documents."""
    return {
        str(document.get(key, i)): judge([*documents[:i], *documents[i + 1 :]]) for i, document in enumerate(documents)
    }


def held_without_a_replica(judgement: LiveJudgement, without: Mapping[str, LiveJudgement]) -> LiveJudgement:
    """``judgement`` less what rests on one replica's figures alone. ``without``: replica URL
    -> the same judgement on every other replica's figures."""
    rollback_on = sorted(url for url, other in without.items() if judgement.rollback and not other.rollback)
    breach_on = sorted(url for url, other in without.items() if judgement.latency_breach and not other.latency_breach)
    if not rollback_on and not breach_on:
        return judgement
    held = []
    if rollback_on:
        held.append(f"the live rollback rests on the figures of {', '.join(rollback_on)} alone: held, not acted on")
    if breach_on:
        held.append(f"the live latency breach rests on the figures of {', '.join(breach_on)} alone: held")
    monitors = [
        replace(m, in_band=True) if breach_on and m.name in LATENCY_MONITORS and m.name.startswith("live_") else m
        for m in judgement.monitors
    ]
    return replace(
        judgement,
        rollback=judgement.rollback and not rollback_on,
        latency_breach=judgement.latency_breach and not breach_on,
        monitors=monitors,
        not_ready_reasons=[*judgement.not_ready_reasons, *held],
        reasons=[*judgement.reasons, *held],
    )
