"""The canary watch as the registry keeps it: a window per canary version with the
thresholds it opened with, the observations judged in it, and the flow run waiting for its
sign-off (the sign-off itself: ``service/approvals.py``).

A window decides who among the adapter's users the version answers, so it is opened only
for the adapter's canary, validated and signed, and its share stays at most the operator's
cap (``LORAGATE_CANARY_MAX_SHARE``) until a person has signed the version off
(``rules/share.py``). The registry's owner in process is held to neither, as the database's
owner is not; on Postgres the database holds the roles' users to the same rules (migration
0012)."""

from __future__ import annotations

from loragate.registry.db.canary_share import CapLift
from loragate.registry.errors import ErrorCode, IllegalTransition, NotFound
from loragate.registry.rules.access import Action, Role
from loragate.registry.rules.canary import ACTIVE, CanaryThresholds, CanaryWindow, Observation, WindowStatus
from loragate.registry.rules.lifecycle import ValidationStatus
from loragate.registry.rules.share import above_cap, check_share
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
            IllegalTransition: the version is not the adapter's canary; VALIDATION_REQUIRED,
                its latest validation did not pass; SIGNATURE_REQUIRED, it is not signed over
                that validation by an active signing key.
            PermissionDenied: SHARE_ABOVE_CAP, a share above the cap (only the owner in
                process opens one so).
        """
        share = check_share(self.settings.canary_share if share is None else share)
        version = self._store.versions.get(version_id)
        actor = self._authorize(Action.WATCH_CANARY, version.name)
        self._check_validated_and_signed(version_id)
        cap, _ = self._share_cap(version.name)
        if share > cap:
            raise above_cap(share, cap, version_id)
        thresholds = CanaryThresholds.from_settings(self.settings)
        return self._store.canary.open_window(version.name, version_id, thresholds, actor, share)

    def check_canary_ready(self, version_id: str) -> None:
        """What opening ``version_id``'s canary window will ask of the version itself, asked
        before anything moves: the canary gate checks it before switching a replica.

        Raises:
            NotFound: no such version.
            IllegalTransition: VALIDATION_REQUIRED or SIGNATURE_REQUIRED.
        """
        self._store.versions.get(version_id)
        self._check_validated_and_signed(version_id)

    def _check_validated_and_signed(self, version_id: str) -> None:
        """Its latest validation passed and a signature over that validation is by an active
        signing key: the records the database checks too. The signature's bytes are verified
        where they are served (a production move, each replica's copy).

        Raises:
            IllegalTransition: VALIDATION_REQUIRED or SIGNATURE_REQUIRED.
        """
        runs = self._store.validation.runs(version_id)
        if not runs or runs[-1].status != ValidationStatus.PASSED:
            raise IllegalTransition(
                f"{version_id} has not passed validation: a canary window opens only for a validated version",
                code=ErrorCode.VALIDATION_REQUIRED,
                field="version_id",
            )
        for signature in self._store.access.signatures(version_id):
            key = self._store.access.signing_key(signature.key_id)
            by_signing_key = key is not None and key.active and key.role == Role.SIGNING
            if by_signing_key and signature.validation_run_id == runs[-1].id:
                return
        raise IllegalTransition(
            f"{version_id} has no signature by an active signing key over its latest validation: "
            "a canary window opens only for a signed version (loragate sign)",
            code=ErrorCode.SIGNATURE_REQUIRED,
            field="version_id",
        )

    def _share_cap(self, name: str) -> tuple[float, CapLift | None]:
        """The cap the caller's share of ``name``'s users is held to, and what lifts it: a
        person's sign-off pending, for a caller who may promote to production. The owner in
        process is held to none."""
        principal = self.principal
        if principal.owner_in_process:
            return 1.0, None
        lift = self._store.sign_offs.sign_off_pending if principal.may(Action.PROMOTE_PRODUCTION, name) else None
        return self.settings.canary_max_share, lift

    def canary_windows(
        self,
        statuses: tuple[WindowStatus, ...] | None = ACTIVE,
        version_id: str | None = None,
        *,
        least_recently_observed: bool = False,
    ) -> list[CanaryWindow]:
        """Windows by status (active ones by default), oldest first -- or, with
        ``least_recently_observed``, never observed first, then by their latest observation."""
        return self._store.canary.windows(
            statuses=statuses, version_id=version_id, least_recently_observed=least_recently_observed
        )

    def active_canary_window(self, name: str) -> CanaryWindow | None:
        """The adapter's open or ready window (at most one: migration 0008), or None."""
        found = self._store.canary.windows(statuses=ACTIVE, adapter_name=name)
        return found[-1] if found else None

    def set_canary_share(self, name_or_window: str | int, share: float, reason: str | None = None) -> CanaryWindow:
        """Give the active canary window of adapter ``name_or_window`` (or the window of that
        id) ``share`` of the adapter's live requests; the same share again changes nothing.
        Audited as ``canary_share`` with the share it replaced. Above the cap only on a
        person's sign-off pending, for a caller who may promote (or the owner in process).

        Raises:
            InvalidInput: INVALID_SHARE, not a finite number in [0, 1]; INVALID_TEXT, a reason
                that is not one line of printable text (nothing changed either way).
            NotFound: no such window, or the adapter has no active one.
            IllegalTransition: the window is closed.
            PermissionDenied: SHARE_ABOVE_CAP (nothing changed).
        """
        share = check_share(share)
        check_text(reason, field="reason")
        window = self._share_window(name_or_window)
        actor = self._authorize(Action.WATCH_CANARY, window.adapter_name)
        cap, lift = self._share_cap(window.adapter_name)
        return self._store.canary_share.set_share(window.id, share, actor, reason, cap=cap, lift=lift)

    def check_canary_share(self, name_or_window: str | int, share: float) -> CanaryWindow:
        """The window ``set_canary_share`` would change, once the caller may give it
        ``share`` now: for a caller that acts elsewhere first (warms replicas). A look, not a
        reservation: the change itself decides again.

        Raises:
            InvalidInput, NotFound, PermissionDenied: as ``set_canary_share``.
        """
        share = check_share(share)
        window = self._share_window(name_or_window)
        self._authorize(Action.WATCH_CANARY, window.adapter_name)
        cap, lift = self._share_cap(window.adapter_name)
        if not self._store.canary_share.share_allowed(window.id, share, cap=cap, lift=lift):
            raise above_cap(share, cap, window.version_id)
        return window

    def canary_share_allowed(self, window: CanaryWindow, share: float) -> bool:
        """Whether the caller may give ``window`` ``share`` now, as far as the cap goes: the
        promotion asks before sending every user to the canary."""
        cap, lift = self._share_cap(window.adapter_name)
        return self._store.canary_share.share_allowed(window.id, share, cap=cap, lift=lift)

    def _share_window(self, name_or_window: str | int) -> CanaryWindow:
        if isinstance(name_or_window, int) and not isinstance(name_or_window, bool):
            return self._store.canary.window(name_or_window)
        active = self.active_canary_window(str(name_or_window))
        if active is None:
            raise NotFound(f"{name_or_window} has no open canary window", field="name")
        return active

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
        """Store the evaluation's observation of an open window; a READY verdict moves it to
        ready, an UNDECIDED one ends it undecided (the only way to either). The evaluation's
        role alone judges a canary (``JUDGE_CANARY``; on Postgres the evaluator's function,
        migration 0015).

        Raises:
            NotFound: no such window.
            IllegalTransition: the window is not open.
            PermissionDenied: the caller's role does not judge canaries.
        """
        window = self._store.canary.window(observation.window_id)
        return self._store.canary_verdicts.record_observation(
            observation, self._authorize(Action.JUDGE_CANARY, window.adapter_name)
        )

    def canary_observations(self, window_id: int) -> list[Observation]:
        return self._store.canary_verdicts.observations(window_id)

    def close_canary_window(self, window_id: int, status: WindowStatus, reason: str | None) -> CanaryWindow:
        """Move a window to ``status`` (already there: no-op).

        Raises:
            InvalidInput: INVALID_TEXT, a reason that is not one line of printable text.
            NotFound: no such window.
            IllegalTransition: the window cannot move there (a promoted window cannot be
                rolled back through its canary, say), or only a verdict moves it there
                (ready, undecided: ``record_canary_observation``).
        """
        check_text(reason, field="reason")
        actor = self._authorize(Action.WATCH_CANARY, self._store.canary.window(window_id).adapter_name)
        return self._store.canary.move_window(window_id, status, reason, actor)

    def request_approval(self, window_id: int, flow_run_id: str, replacing: str | None = None) -> CanaryWindow:
        """Claim the window's sign-off for a flow run, unless another run holds it (the
        returned window says who does); ``replacing`` names a run known to be gone."""
        actor = self._authorize(Action.WATCH_CANARY, self._store.canary.window(window_id).adapter_name)
        return self._store.canary.set_approval_run(window_id, flow_run_id, replacing, actor)
