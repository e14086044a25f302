"""Warm copies have a lifecycle: after every pointer move, each production replica keeps at
most an adapter's canary and one previous version beside its plain name.

A warm copy is a version served as ``name@version`` beside the adapter's plain name. It
exists for two reasons only (``rules/fleet.py`` ``warm_versions``): the canary, while its
window is active, answers its share of live users on the production replicas
(``tasks/traffic.py`` warms it before any user gets it); the previous production, kept
after a promotion (``keep_previous_warm``), makes a rollback a routing change. Any other
copy -- a version rolled back, withdrawn, or replaced two promotions ago -- would go on
answering whoever names it until the replica restarts, and every promotion would leave one
more per adapter per replica.

``settle_warm_copies`` runs once a move has committed (``FleetSwitch.after_commit``: every
promotion, rollback and canary withdrawal), under the adapter's lock so that no move in
flight is taken for a leftover, on every production replica at once:

1. Production ends under its plain name. A move that only sent users to a warm copy left
   production served as ``name@production`` and, where every replica was such a move (a
   rollback to the warm previous version), the plain name still on the version moved off and
   the index naming it: nothing on the replicas changed under the move's lock, so users waited
   only for the commit and the routes (the split sends them to ``name@production`` while the
   index names another version). Here the stale plain name is unloaded on every replica first,
   then the index is pointed at production -- in that order, so no replica serves the old bytes
   under a name the index gives production -- and should a replica not answer, nothing more is
   done (its users stay on the warm copy; ``fleet reconcile`` finishes). The plain name is
   loaded again from production's path (``load_replica``: the replica checks the bytes
   against the registry), its card and golden answers verified as a switch's, and only then
   is ``name@production`` unloaded. Users are answered by the warm copy until the plain
   name is loaded, by the plain name from then on (the split prefers it), so nobody waits.
   If the plain name does not verify it is unloaded again and the warm copy stays.
2. Every other qualified copy of the adapter the pointers no longer allow is unloaded.

So ``rollback_and_switch`` returns with the rolled-back version served under no name on any
reachable production replica. A failure is reported through ``progress`` and in the result,
never raised: the move has committed; ``fleet reconcile`` unloads what is left (``fleet
status`` lists it as a stray), and the replicas' registry check refuses to load a version
the pointers no longer name.
"""

from __future__ import annotations

from typing import Any

from loragate.registry.errors import DeployFailed, LoragateError, ReplicaError
from loragate.registry.intake.golden import GoldenSet
from loragate.registry.progress import Progress, quiet
from loragate.registry.rules.fleet import (
    ActionKind,
    AdapterPointers,
    Placement,
    Replica,
    ReplicaRole,
    qualified_name,
    split_qualified,
    version_path,
    warm_versions,
)
from loragate.registry.service import Registry
from loragate.registry.storage.resolver_index import adapter_entries, replace_entries
from loragate.tasks.replica_switch import load_replica, unload_replica, verify_replica
from loragate.tasks.replicas import ReplicaClient, replica_client
from loragate.tasks.routes import failures, on_each

# what a replica serving the version must answer (``Registry.expected_outputs``)
Expected = tuple[GoldenSet, dict[str, str]] | None
# the audited actions (``warm_copies`` events): production loaded under its plain name again,
# a warm copy unloaded
LOAD_PLAIN = "load_plain"
UNLOAD_STRAY = ActionKind.UNLOAD_STRAY.value


def settle_warm_copies(registry: Registry, name: str, progress: Progress = quiet) -> list[dict[str, Any]]:
    """On every production replica of ``name``'s base: production under the plain name, the
    warm copies the pointers do not allow unloaded (module docstring), each audited as a
    ``warm_copies`` event. Returns what was done, a row per action; failures are reported
    through ``progress``, never raised."""
    try:
        with registry.holding_adapter(name) as held:
            if held is None:
                return []
            window = registry.active_canary_window(name)
            allowed = warm_versions(held, window.version_id if window else None)
            every_replica = registry.list_replicas(held.base_model_id)
            replicas = [r for r in every_replica if r.role == ReplicaRole.PRODUCTION]
            dropped = on_each(replicas, lambda r: _drop_stale_plain(registry, r, held))
            unreached = failures(dropped)
            for failure in unreached:
                progress(f"{failure}: stale {name} not unloaded; its users stay on the warm copy; fleet reconcile will")
            if unreached:
                return []
            if any(dropped.values()):
                _point_indexes(registry, every_replica, held)
            expected = registry.expected_outputs(held.production) if held.production else None
            results = on_each(replicas, lambda r: _settle(registry, r, held, allowed, expected))
    except LoragateError as e:  # the lock or the registry: no replica was touched
        progress(f"{name}: warm copies not settled ({e.one_line()}); fleet reconcile will")
        return []
    done: list[dict[str, Any]] = []
    for url, result in sorted(results.items()):
        if isinstance(result, BaseException):
            cause = result.one_line() if isinstance(result, LoragateError) else f"{type(result).__name__}: {result}"
            progress(f"{url}: warm copies of {name} not settled ({cause}); fleet reconcile will")
            continue
        actions, errors = result
        done += actions
        for action in actions:
            progress(f"{url}: {action['kind']} {action['served_as']}")
        for error in errors:
            progress(f"{url}: {error}; fleet reconcile will")
    if done:
        try:
            registry.record_fleet_actions("warm_copies", done)
        except LoragateError as e:
            progress(f"{name}: warm copies settled but not audited ({e.one_line()})")
    return done


def _drop_stale_plain(registry: Registry, replica: Replica, held: AdapterPointers) -> bool:
    """Unload the plain name where it serves another version than production (a move that
    only changed where users go left it there); whether it was. Users meanwhile get the warm
    ``name@production``, or one the resolver loads from production's own path.

    Raises:
        ReplicaError: the replica could not be read or the name not unloaded.
    """
    name, production = held.name, held.production
    if production is None:
        return False
    path = version_path(replica.adapter_dir, name, production)
    with replica_client(registry, replica.url, retries=1) as client:
        served = client.served_adapters()
        if served.get(name) in (None, path):
            return False
        unload_replica(client, name)
    return True


def _point_indexes(registry: Registry, replicas: list[Replica], held: AdapterPointers) -> None:
    """Every adapter directory's index entries of this adapter as the pointers say (only this
    adapter's: the lock held is its own)."""
    for adapter_dir, entries in adapter_entries(replicas, held, registry.bundle_digests).items():
        replace_entries(adapter_dir, held.name, entries)


def _settle(
    registry: Registry, replica: Replica, held: AdapterPointers, allowed: frozenset[str], expected: Expected
) -> tuple[list[dict[str, Any]], list[str]]:
    """One replica: production under the plain name, then the copies not allowed unloaded;
    (what was done, what failed).

    Raises:
        ReplicaError: the replica could not be read (nothing was changed on it).
    """
    name, production = held.name, held.production
    done: list[dict[str, Any]] = []
    errors: list[str] = []

    def did(kind: str, served_as: str, version: str, path: str) -> None:
        done.append(
            {"replica": replica.url, "kind": kind, "name": name, "served_as": served_as, "version_id": version}
            | ({"from": path} if kind == UNLOAD_STRAY else {"to": version})
        )

    with replica_client(registry, replica.url, retries=1) as client:
        served = client.served_adapters()
        path = version_path(replica.adapter_dir, name, production) if production else None
        if production and path and name not in served and served.get(qualified_name(name, production)) == path:
            try:
                _plain_again(client, replica, Placement(name, production, path), expected, registry)
                served[name] = path
                did(LOAD_PLAIN, name, production, path)
            except (DeployFailed, ReplicaError) as e:
                errors.append(f"{name} not loaded under its plain name ({e.one_line()}); its warm copy stays")
        for served_as, served_from in sorted(served.items()):
            qualified = split_qualified(served_as)
            if qualified is None or qualified[0] != name:
                continue
            version = qualified[1]
            if version in allowed and served_from == version_path(replica.adapter_dir, name, version):
                continue
            if version == production and served.get(name) != path:
                continue  # production's only good copy here: the plain name is reconcile's to fix first
            try:
                client.unload(served_as)
                did(UNLOAD_STRAY, served_as, version, served_from)
            except ReplicaError as e:
                errors.append(f"{served_as} not unloaded ({e.one_line()})")
    return done, errors


def _plain_again(
    client: ReplicaClient, replica: Replica, placement: Placement, expected: Expected, registry: Registry
) -> None:
    """Load the plain name from production's path and verify it as a switch does; where it
    does not verify, unload it again so users stay on the warm copy.

    Raises:
        DeployFailed, ReplicaError: as ``load_replica`` and ``verify_replica``.
    """
    load_replica(client, placement.name, placement.path)
    try:
        verify_replica(client, replica, placement, expected, registry.settings.deploy_agreement)
    except (DeployFailed, ReplicaError):
        unload_replica(client, placement.name)
        raise
