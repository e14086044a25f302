"""The serving fleet: which vLLM replicas serve which base, and what each should serve.

A replica serves one pinned base in one role. Production replicas serve every adapter's
production version; canary replicas serve an adapter's canary version when it has one, its
production version otherwise. Each version a replica serves lives in the replica-visible
adapter directory under an immutable path of its own (``<dir>/<name>/<version id>``): vLLM's
prefix cache is keyed by (adapter name, path), so a new path per version rules out stale
cache blocks, and a path is never reused for other bytes.

Beside the plain name a replica may keep **warm copies**, versions served as
``name@version``: the canary while its window is active (the live split answers its share
on the production replicas) and the previous production (a rollback then only moves
traffic) -- at most those two per adapter (``warm_versions``). Production itself is served
under the plain name; any other qualified copy of this base's adapters is a stray that
``plan_reconcile`` unloads (``loragate/tasks/warm_copies.py`` unloads them after each move).

This module is pure planning, like ``lifecycle``: the desired state of the fleet from the
pointers and the actions that turn a replica's actual state into it. The index files the
resolver plugin reads are written by ``loragate.registry.storage.resolver_index``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from loragate.registry.errors import ErrorCode, InvalidInput
from loragate.registry.rules.names import AdapterName


class ReplicaRole(StrEnum):
    CANARY = "canary"
    PRODUCTION = "production"


def replica_role(role: str) -> ReplicaRole:
    """The role ``role`` names.

    Raises:
        InvalidInput: INVALID_SETTING naming ``role``, neither canary nor production.
    """
    try:
        return ReplicaRole(role)
    except ValueError as e:
        raise InvalidInput(
            f"role {role!r} is not canary or production", code=ErrorCode.INVALID_SETTING, field="role"
        ) from e


@dataclass(frozen=True)
class Replica:
    url: str
    base_model_id: str
    base_model_commit: str
    role: ReplicaRole
    # where loragate materializes bundles, as the replica sees it (a shared volume)
    adapter_dir: str
    # the replica's --max-lora-rank and --max-loras
    max_lora_rank: int
    max_loras: int
    # the name the replica serves its base under (--served-model-name)
    served_model_name: str
    created_at: datetime | None = None
    created_by: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "base_model_id": self.base_model_id,
            "base_model_commit": self.base_model_commit,
            "role": self.role.value,
            "adapter_dir": self.adapter_dir,
            "max_lora_rank": self.max_lora_rank,
            "max_loras": self.max_loras,
            "served_model_name": self.served_model_name,
            "created_at": self.created_at.isoformat() if self.created_at else None,
            "created_by": self.created_by,
        }


@dataclass(frozen=True)
class Placement:
    """One adapter version on a replica: where its bundle is, as the replica sees it."""

    name: str
    version_id: str
    path: str


# a version served beside its adapter's plain name, as ``name@version``: the canary warm on the
# production replicas while its window splits traffic, the previous production kept warm for a
# rollback that only moves traffic. Only the fleet's admin key can address it; the replicas'
# traffic split sends users there (infra/vllm_plugin/loragate_resolver/traffic.py).
QUALIFIER = "@"


def qualified_name(name: str, version_id: str) -> str:
    """The name a replica serves one version of ``name`` under, beside the plain name."""
    return f"{name}{QUALIFIER}{version_id}"


def split_qualified(served_name: str) -> tuple[str, str] | None:
    """(adapter name, version) of a qualified served name; None for a plain one."""
    name, sep, version = served_name.rpartition(QUALIFIER)
    if not sep or not name or not version:
        return None
    return name, version


def adapter_of(served_name: str) -> str:
    """The adapter a served name is of: itself, or the plain name of a qualified one."""
    qualified = split_qualified(served_name)
    return qualified[0] if qualified else served_name


def version_path(adapter_dir: str, name: str, version_id: str) -> str:
    """The immutable replica-visible path of one version's bundle."""
    return os.path.join(adapter_dir, *name.split("/"), version_id)


@dataclass(frozen=True)
class AdapterPointers:
    name: str
    base_model_id: str
    canary: str | None
    production: str | None
    previous: str | None = None
    # when the production pointer last moved: how old what users get is
    production_since: datetime | None = None


def warm_versions(pointers: AdapterPointers, window_version: str | None) -> frozenset[str]:
    """The versions of an adapter a replica may keep warm as ``name@version``: its canary
    while the canary's window is active (``window_version``, the version of the adapter's
    open or ready window), and its previous production. Never production itself: it is
    served under the plain name."""
    allowed = {pointers.previous} if pointers.previous is not None else set()
    if pointers.canary is not None and pointers.canary == window_version:
        allowed.add(pointers.canary)
    return frozenset(allowed)


def served_version(role: ReplicaRole, pointers: AdapterPointers) -> str | None:
    """The version of an adapter a replica of ``role`` serves."""
    if role == ReplicaRole.CANARY and pointers.canary is not None:
        return pointers.canary
    return pointers.production


def desired_placements(replica: Replica, adapters: Iterable[AdapterPointers]) -> dict[str, Placement]:
    """What ``replica`` should serve, by adapter name, from the adapters' pointers."""
    wanted = {}
    for pointers in adapters:
        if pointers.base_model_id != replica.base_model_id:
            continue
        version = served_version(replica.role, pointers)
        if version is not None:
            wanted[pointers.name] = Placement(
                pointers.name, version, version_path(replica.adapter_dir, pointers.name, version)
            )
    return wanted


class ActionKind(StrEnum):
    LOAD = "load"  # the name is not served: load it from its path
    SWITCH = "switch"  # served from another path: switch it to the wanted one
    UNLOAD = "unload"  # served, but no pointer wants it here
    REPAIR = "repair"  # served from the wanted path, but the bytes there do not verify
    # a warm copy ``name@version`` the pointers do not allow (``warm_versions``), or served
    # from another path than its version's: it would answer whoever names it
    UNLOAD_STRAY = "unload_stray"


@dataclass(frozen=True)
class FleetAction:
    replica: str
    kind: ActionKind
    name: str
    served_path: str | None  # what the replica serves the name from now
    placement: Placement | None  # what it should serve (None for an unload)
    # files of the wanted copy that are missing or do not match their digests
    damaged: tuple[str, ...] = ()
    # why a stray warm copy goes
    why: str = ""

    @property
    def adapter(self) -> str:
        return adapter_of(self.name)

    def describe(self) -> str:
        if self.kind == ActionKind.UNLOAD:
            return f"{self.replica}: unload {self.name} (served from {self.served_path}, no pointer wants it)"
        if self.kind == ActionKind.UNLOAD_STRAY:
            return f"{self.replica}: unload stray warm copy {self.name} (served from {self.served_path}: {self.why})"
        assert self.placement is not None
        damage = (
            f" ({', '.join(self.damaged)} at {self.placement.path} do not match their digests)" if self.damaged else ""
        )
        if self.kind == ActionKind.REPAIR:
            return f"{self.replica}: repair {self.name} = {self.placement.version_id}{damage}"
        if self.kind == ActionKind.LOAD:
            return f"{self.replica}: load {self.name} = {self.placement.version_id}{damage}"
        return f"{self.replica}: switch {self.name} from {self.served_path} to {self.placement.version_id}{damage}"


def plan_reconcile(
    replica: Replica,
    desired: Mapping[str, Placement],
    served: Mapping[str, str],
    damaged: Mapping[str, list[str]] | None = None,
    warm: Mapping[str, frozenset[str]] | None = None,
) -> list[FleetAction]:
    """The actions that make what ``replica`` serves (served name -> path) what is desired,
    given which wanted copies on disk do not verify (adapter name -> damaged files) and which
    versions each adapter may keep warm (adapter name -> ``warm_versions``).

    Only adapters bound to the replica's base are loragate's to unload: a name that is not
    ``<namespace>/<base>/<task>`` of this base, or that name with ``@version``, was put there
    by someone else and stays. A warm copy ``name@version`` of an allowed version from its
    own path is left alone, and one that is missing is no drift (warmed when it is needed);
    any other is a stray. The stray unloads come after the loads, so production left served
    only warm by a move that just moved traffic is loaded under its plain name first.
    """
    damaged = damaged or {}
    warm = warm or {}
    actions = []
    for name, placement in sorted(desired.items()):
        current = served.get(name)
        bad = tuple(damaged.get(name, ()))
        if current is None:
            actions.append(FleetAction(replica.url, ActionKind.LOAD, name, None, placement, bad))
        elif current != placement.path:
            actions.append(FleetAction(replica.url, ActionKind.SWITCH, name, current, placement, bad))
        elif bad:
            actions.append(FleetAction(replica.url, ActionKind.REPAIR, name, current, placement, bad))
    for name, path in sorted(served.items()):
        qualified = split_qualified(name)
        if qualified is None:
            if name not in desired and _base_of(name) == replica.base_model_id:
                actions.append(FleetAction(replica.url, ActionKind.UNLOAD, name, path, None))
            continue
        adapter, version = qualified
        if _base_of(adapter) != replica.base_model_id:
            continue
        why = _stray(replica, adapter, version, path, desired.get(adapter), warm.get(adapter, frozenset()))
        if why:
            actions.append(FleetAction(replica.url, ActionKind.UNLOAD_STRAY, name, path, None, why=why))
    return actions


def _stray(
    replica: Replica, adapter: str, version: str, path: str, production: Placement | None, allowed: frozenset[str]
) -> str:
    """Why a replica's warm copy of ``adapter`` at ``version`` must go; "" when it may stay."""
    if version not in allowed:
        if production is not None and production.version_id == version:
            return f"{version} is served under the plain name"
        return f"{version} is neither the canary of an active window nor the previous production"
    if path != version_path(replica.adapter_dir, adapter, version):
        return f"not {version}'s own copy"
    return ""


def _base_of(served_name: str) -> str | None:
    """The base segment of a served adapter name; None for a name loragate did not give."""
    try:
        return AdapterName.parse(served_name).base
    except InvalidInput:
        return None
