"""The canary watch as the registry keeps it: a window per canary version with the
thresholds it opened with, the observations judged in it, and the flow run waiting for its
sign-off (the sign-off itself: ``service/approvals.py``)."""

from __future__ import annotations

from loragate.registry.errors import IllegalTransition, NotFound
from loragate.registry.rules.access import Action
from loragate.registry.rules.canary import ACTIVE, CanaryThresholds, CanaryWindow, Observation, WindowStatus
from loragate.registry.rules.lifecycle import Pointer
from loragate.registry.rules.share import check_share
from loragate.registry.rules.text import check_text
from loragate.registry.service.base import RegistryBase


class CanaryMixin(RegistryBase):
    def open_canary_window(self, version_id: str, share: float | None = None) -> tuple[CanaryWindow, bool]:
        """Open the canary window of the adapter's current canary, with the thresholds the
        settings give now (the window keeps them) and ``share`` of the adapter's live
        requests (None: LORAGATE_CANARY_SHARE); returns (window, created). Opening it
        again returns the active one as it is; another version's active window is superseded.

        Raises:
            InvalidInput: INVALID_SHARE, a share outside [0, 1] (nothing changed).
            NotFound: no such version.
            IllegalTransition: the version is not the adapter's canary.
        """
        share = check_share(self.settings.canary_share if share is None else share)
        version = self._store.versions.get(version_id)
        if self._store.pointers.resolve(version.name, Pointer.CANARY.value) != version_id:
            raise IllegalTransition(
                f"{version_id} is {version.stage.value}, not the canary of {version.name}: promote it to canary first",
                field="version_id",
            )
        actor = self._authorize(Action.WATCH_CANARY, version.name)
        thresholds = CanaryThresholds.from_settings(self.settings)
        return self._store.canary.open_window(version.name, version_id, thresholds, actor, share)

    def canary_windows(
        self, statuses: tuple[WindowStatus, ...] | None = ACTIVE, version_id: str | None = None
    ) -> list[CanaryWindow]:
        """Windows by status (active ones by default), oldest first."""
        return self._store.canary.windows(statuses=statuses, version_id=version_id)

    def active_canary_window(self, name: str) -> CanaryWindow | None:
        """The adapter's open or ready window (at most one: migration 0008), or None."""
        found = self._store.canary.windows(statuses=ACTIVE, adapter_name=name)
        return found[-1] if found else None

    def set_canary_share(self, name_or_window: str | int, share: float, reason: str | None = None) -> CanaryWindow:
        """Give the active canary window of adapter ``name_or_window`` (or the window of that
        id) ``share`` of the adapter's live requests; the same share again changes nothing.
        Audited as ``canary_share`` with the share it replaced.

        Raises:
            InvalidInput: INVALID_SHARE, not a finite number in [0, 1]; INVALID_TEXT, a reason
                that is not one line of printable text (nothing changed either way).
            NotFound: no such window, or the adapter has no active one.
            IllegalTransition: the window is closed.
        """
        share = check_share(share)
        check_text(reason, field="reason")
        if isinstance(name_or_window, int) and not isinstance(name_or_window, bool):
            window = self._store.canary.window(name_or_window)
        else:
            active = self.active_canary_window(str(name_or_window))
            if active is None:
                raise NotFound(f"{name_or_window} has no open canary window", field="name")
            window = active
        actor = self._authorize(Action.WATCH_CANARY, window.adapter_name)
        return self._store.canary.set_share(window.id, share, actor, reason)

    def canary_window(self, window_id: int) -> CanaryWindow:
        """Raises:
        NotFound: no such window.
        """
        return self._store.canary.window(window_id)

    def latest_canary_window(self, version_id: str) -> CanaryWindow:
        """The newest window of a version.

        Raises:
            NotFound: the version never had one.
        """
        self._store.versions.get(version_id)
        windows = self._store.canary.windows(version_id=version_id)
        if not windows:
            raise NotFound(f"{version_id} has never been canaried", field="version_id")
        return windows[-1]

    def record_canary_observation(self, observation: Observation) -> Observation:
        """Store an observation; a READY verdict moves the window to ready.

        Raises:
            NotFound: no such window.
        """
        window = self._store.canary.window(observation.window_id)
        return self._store.canary.record_observation(
            observation, self._authorize(Action.WATCH_CANARY, window.adapter_name)
        )

    def canary_observations(self, window_id: int) -> list[Observation]:
        return self._store.canary.observations(window_id)

    def close_canary_window(self, window_id: int, status: WindowStatus, reason: str | None) -> CanaryWindow:
        """Move a window to ``status`` (already there: no-op).

        Raises:
            InvalidInput: INVALID_TEXT, a reason that is not one line of printable text.
            NotFound: no such window.
            IllegalTransition: the window cannot move there (a promoted window cannot be
                rolled back through its canary, say).
        """
        check_text(reason, field="reason")
        actor = self._authorize(Action.WATCH_CANARY, self._store.canary.window(window_id).adapter_name)
        return self._store.canary.move_window(window_id, status, reason, actor)

    def request_approval(self, window_id: int, flow_run_id: str, replacing: str | None = None) -> CanaryWindow:
        """Claim the window's sign-off for a flow run, unless another run holds it (the
        returned window says who does); ``replacing`` names a run known to be gone."""
        actor = self._authorize(Action.WATCH_CANARY, self._store.canary.window(window_id).adapter_name)
        return self._store.canary.set_approval_run(window_id, flow_run_id, replacing, actor)
