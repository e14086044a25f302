"""Production sign-offs that prove who gave them (``rules/approvals.py``): an approval code
issued to the caller's own activation token, and the decision recorded only with a code
that proves it -- redeemed once, in the same transaction."""

from __future__ import annotations

from registry.errors import ApprovalRefused, ErrorCode, InvalidInput, NotFound, PermissionDenied
from registry.records.adapters import utcnow
from registry.rules.access import Action
from registry.rules.approvals import ApprovalCode, Decision, PresentedCode, Redemption, check_ttl, issue_code
from registry.rules.canary import CanaryWindow
from registry.rules.text import check_text
from registry.service.base import RegistryBase


class ApprovalMixin(RegistryBase):
    def issue_approval_code(
        self, version_id: str, *, approve: bool = True, ttl_s: float | None = None
    ) -> tuple[ApprovalCode, str]:
        """A single-use code for the sign-off of ``version_id``'s canary window, issued to
        the caller's own activation token and its holder; returns (record, code). The code
        is shown once: only its hash is stored.

        Raises:
            InvalidInput: INVALID_SETTING for a ttl outside 30 s .. 24 h.
            NotFound: no such version, or it was never canaried.
            IllegalTransition: its window is not waiting for a sign-off.
            PermissionDenied: the caller holds no activation token for the adapter (a code
                is issued to a token: the registry's owner has none).
        """
        ttl = check_ttl(self.settings.approval_code_ttl_s if ttl_s is None else ttl_s)
        self._store.versions.get(version_id)
        windows = self._store.canary.windows(version_id=version_id)
        if not windows:
            raise NotFound(f"{version_id} has never been canaried: there is no sign-off to give", field="version")
        window = windows[-1]
        actor = self._authorize(Action.APPROVE, window.adapter_name)
        principal = self.principal
        if principal.token_id is None:
            raise PermissionDenied(
                f"{actor} holds no token: an approval code is issued to an activation token", field="LORAGATE_TOKEN"
            )
        found = self._store.access.token(principal.token_id)
        if found is None:  # revoked and gone between authentication and now: nothing issued
            raise PermissionDenied(f"token {principal.token_id} is unknown", field="LORAGATE_TOKEN")
        token, _ = found
        issued = issue_code()
        record = self._store.approvals.issue(issued, window.id, token, Decision.of(approve), ttl, actor)
        return record, issued.code

    def approval_codes(self, window_id: int) -> list[ApprovalCode]:
        """The codes issued for a window's sign-off, oldest first (never their secrets)."""
        return self._store.approvals.codes(window_id)

    def record_approval(
        self,
        window_id: int,
        *,
        approve: bool,
        reviewer: str,
        code: str,
        comment: str = "",
        flow_run_id: str | None = None,
    ) -> CanaryWindow:
        """The sign-off decision, recorded only when ``code`` proves it: issued for this
        window and decision to ``reviewer``'s still-active token (not the caller's own),
        unexpired and unused -- it is used now. The audit event names the token. A
        rejection closes the window. A refusal changes nothing but the audit log.

        Raises:
            InvalidInput: INVALID_NAME for an empty reviewer; INVALID_TEXT for a reviewer or
                comment that is not one line of printable text.
            NotFound: no such window.
            IllegalTransition: the window is not waiting for a sign-off.
            PermissionDenied: the caller may not record sign-offs for the adapter.
            ApprovalRefused: the code does not prove the decision (its error code says why).
        """
        if not reviewer.strip():
            raise InvalidInput("a decision needs a reviewer", code=ErrorCode.INVALID_NAME, field="reviewer")
        check_text(reviewer, field="reviewer")
        check_text(comment, field="comment", limit=None)
        name = self._store.canary.window(window_id).adapter_name
        actor = self._authorize(Action.APPROVE, name)
        offer = Redemption(window_id, Decision.of(approve), reviewer.strip(), self.principal.token_id, utcnow())
        presented: PresentedCode | None = None
        try:
            presented = PresentedCode.parse(code)
            return self._store.approvals.record_decision(
                presented, offer, comment=comment, flow_run_id=flow_run_id, actor=actor
            )
        except ApprovalRefused as refused:
            self._store.approvals.record_refusal(refused, presented.code_id if presented else None, offer, actor)
            raise
