"""Pinned adapters as the registry keeps them: a person's pins (``loragate fleet pin``), the
hot pins the traffic watch replaces every minute, and how many each base has room for
(``rules/pinning.py``). The production replicas read the set from the database
(``adapter_pins``) and keep those adapters loaded; ``residency_plan`` counts them in the slots
a production replica needs."""

from __future__ import annotations

from collections.abc import Sequence

from loragate.registry.errors import ErrorCode, InvalidInput
from loragate.registry.rules.access import Action
from loragate.registry.rules.canary import ACTIVE
from loragate.registry.rules.fleet import ReplicaRole
from loragate.registry.rules.names import AdapterName
from loragate.registry.rules.pinning import Pin, PinSource, hot_limit
from loragate.registry.rules.residency import Residence, resident_set
from loragate.registry.service.base import RegistryBase


class PinsMixin(RegistryBase):
    def pins(self) -> list[Pin]:
        """Every pinned adapter (a person's and the hot ones), by name."""
        return self._store.pins.pins()

    def pin(self, name: str) -> tuple[Pin, bool]:
        """Pin adapter ``name`` on every production replica of its base, as the caller's
        decision; returns (pin, changed). Pinning it again changes nothing; a hot pin becomes
        the caller's (the traffic watch then never unpins it). An adapter not yet in
        production may be pinned: it takes a slot once production serves it. Audited.

        Raises:
            InvalidInput: INVALID_NAME for a name that is not ``<namespace>/<base>/<task>``.
            NotFound: UNKNOWN_ADAPTER, no adapter of that name in the registry.
            PermissionDenied: not the admin role (a person's).
        """
        actor = self._authorize(Action.PIN_ADAPTERS, name)
        AdapterName.parse(name)
        return self._store.pins.pin(name, actor)

    def unpin(self, name: str) -> Pin:
        """Remove ``name``'s pin, a person's or a hot one (a hot adapter may be pinned again
        by the next traffic watch); returns what it was. Audited.

        Raises:
            InvalidInput: INVALID_NAME for a name that is not ``<namespace>/<base>/<task>``.
            NotFound: UNKNOWN_ADAPTER for a name no adapter has; NOT_FOUND when it is not pinned.
            PermissionDenied: not the admin role.
        """
        actor = self._authorize(Action.PIN_ADAPTERS, name)
        AdapterName.parse(name)
        return self._store.pins.unpin(name, actor)

    def replace_hot_pins(self, names: Sequence[str]) -> tuple[list[str], list[str]]:
        """Make the hot pins exactly ``names``, in one transaction, leaving every person's pin
        as it is (a name a person pinned stays theirs); returns (added, removed), each audited.
        Two replacements at once leave one of the two sets, never a mix.

        Raises:
            InvalidInput: INVALID_NAME for a name that is not an adapter name; HOT_PINS_OVER_LIMIT
                for more hot pins of a base than ``hot_pin_limits`` leaves; nothing changed.
            NotFound: UNKNOWN_ADAPTER when a name is no adapter's; nothing changed.
            PermissionDenied: neither the fleet role nor admin (Postgres: the database's own
                bound on hot pins, migration 0016).
        """
        actor = self._authorize(Action.MANAGE_FLEET)
        operator = {p.name for p in self._store.pins.pins() if p.source == PinSource.OPERATOR}
        limits = self.hot_pin_limits()
        per_base: dict[str, list[str]] = {}
        for name in sorted(set(names) - operator):
            per_base.setdefault(AdapterName.parse(name).base, []).append(name)
        for base, hot in per_base.items():
            if len(hot) > limits.get(base, 0):
                raise InvalidInput(
                    f"{len(hot)} hot pins of base {base}, its limit is {limits.get(base, 0)}: nothing was pinned",
                    code=ErrorCode.HOT_PINS_OVER_LIMIT,
                    field="names",
                )
        return self._store.pins.replace_hot(list(names), actor)

    def hot_pin_limits(self) -> dict[str, int]:
        """Per base with adapters or production replicas: how many of its adapters may be
        pinned at once (a person's pins included) -- ``LORAGATE_HOT_PINS`` (or the limit init
        wrote to the database, if lower), and at most its
        smallest production replica's ``max_loras`` - its warm copies - 1
        (``rules/pinning.hot_limit``); 0 without production replicas."""
        adapters = self._store.pointers.all_pointers()
        windows = {w.adapter_name: w.version_id for w in self._store.canary.windows(statuses=ACTIVE)}
        slots: dict[str, list[int]] = {}
        for replica in self._store.fleet.replicas():
            if replica.role == ReplicaRole.PRODUCTION:
                slots.setdefault(replica.base_model_id, []).append(replica.max_loras)
        warm: dict[str, int] = {}
        for pointers in adapters:
            kept = resident_set(ReplicaRole.PRODUCTION, [pointers], windows)
            count = sum(1 for _, _, residence in kept if residence == Residence.WARM)
            warm[pointers.base_model_id] = warm.get(pointers.base_model_id, 0) + count
        stored = self._store.limits.hot_pins()  # the database's own bound: the lower of the two holds
        setting = self.settings.hot_pins if stored is None else min(self.settings.hot_pins, stored)
        return {
            base: hot_limit(setting, slots.get(base, []), warm.get(base, 0)) for base in sorted(set(warm) | set(slots))
        }
