"""One replica under fleet control: a logical name loaded, switched or unloaded, and what the
replica then serves verified -- the steps every multi-replica move is made of (``fleet.py``
switches a stage all or nothing, ``reconcile.py`` repairs drift, ``traffic.py`` warms a
version as ``name@version``, ``warm_copies.py`` settles what a move left warm).

A switch is an unload followed by a fresh load, never ``load_inplace`` (vLLM #33791: answers
mixed from both versions under load). Between the two a user's request may find the name
unknown and have the resolver load it from the index, which already names the new path:
``load_replica`` accepts that as done when the path is the one wanted. Verification is the
replica's card (``root`` = the version's path, ``parent`` = the base) and its greedy answers
to the golden prompts against shadow validation's: vLLM can load an adapter with 200 and
serve base output (#34186, #55193).
"""

from __future__ import annotations

from dataclasses import dataclass

from loragate.registry.errors import DeployFailed, ReplicaError
from loragate.registry.intake.golden import GoldenCase, GoldenSet
from loragate.registry.rules.fleet import Placement, Replica
from loragate.tasks.replicas import ReplicaClient


def load_replica(client: ReplicaClient, name: str, path: str) -> None:
    """Serve ``name`` from ``path`` where the replica serves no ``name``.

    A user's request for the name that arrives first is answered by the resolver from the
    index, which already names ``path``; if it wins the race, the load finds the name
    loaded -- from the same path, which is what is checked afterwards.

    Raises:
        ReplicaError: the replica is unreachable or refused, and does not serve ``path``.
    """
    try:
        client.load(name, path)
    except ReplicaError:
        if client.served_adapters().get(name) != path:
            raise


def switch_replica(client: ReplicaClient, name: str, path: str) -> None:
    """Serve ``name`` from ``path``: unload it, load it fresh (``load_replica``: a request in
    between may load it first). Raises ReplicaError as ``load_replica`` does."""
    client.unload(name)
    load_replica(client, name, path)


def unload_replica(client: ReplicaClient, name: str) -> None:
    client.unload(name)


@dataclass(frozen=True)
class Verification:
    matched: int
    total: int
    mismatches: list[str]

    @property
    def agreement(self) -> float:
        return self.matched / self.total if self.total else 1.0


def verify_replica(
    client: ReplicaClient,
    replica: Replica,
    placement: Placement,
    expected: tuple[GoldenSet, dict[str, str]] | None,
    agreement: float,
) -> Verification:
    """What the replica serves for the name is the version: its card, and its answers.

    Raises:
        DeployFailed: the card names another path or base, or the greedy completions of
            the golden prompts agree with shadow validation's below ``agreement``.
        ReplicaError: the replica is unreachable or refused.
    """
    card = next((m for m in client.models() if m.id == placement.name), None)
    if card is None or card.root != placement.path or card.parent != replica.served_model_name:
        seen = f"root {card.root}, parent {card.parent}" if card else "not served"
        raise DeployFailed(
            f"replica {replica.url} serves {placement.name} as {seen}, "
            f"not {placement.path} on {replica.served_model_name}",
            field="url",
        )
    if expected is None:
        return Verification(0, 0, [])
    golden, outputs = expected
    mismatches = []
    by_length: dict[int, list[GoldenCase]] = {}
    for case in golden.cases:
        by_length.setdefault(case.max_tokens, []).append(case)
    for max_tokens, cases in by_length.items():
        served = client.complete_many(placement.name, [c.prompt for c in cases], max_tokens, admin=True)
        mismatches += [
            c.id for c, text in zip(cases, served, strict=True) if text.strip() != outputs.get(c.id, "").strip()
        ]
    result = Verification(len(golden.cases) - len(mismatches), len(golden.cases), mismatches)
    if result.agreement < agreement:
        raise DeployFailed(
            f"replica {replica.url} answers {len(mismatches)}/{result.total} golden prompts differently from "
            f"shadow validation for {placement.version_id} (e.g. {mismatches[:2]}): it loaded the adapter but "
            "does not serve it",
            field="url",
        )
    return result
