"""Answer a paused flow run's approval form in the Prefect UI from a real headless browser.

Debian's ``chromium`` (``make test`` installs it) driven by Playwright: Playwright's own
browser download cannot reach its servers from here. What a reviewer does by hand:
open the run's page, click ``Resume``, set the fields of the "Resume Flow Run" dialog
(rendered by Prefect from ``loragate.flows.approval.Approval``'s JSON schema: a switch for
``approve``, textareas for ``reviewer``, ``code`` and ``comment``), and click ``Submit``.

Selectors, as Prefect 3.8's UI renders the form: each field is a ``.schema-form-property``
whose ``.schema-form-property__label`` reads "<Title> (Optional)"; its ``<label for=...>``
points at no element, so Playwright's ``get_by_label`` finds nothing and the field is
located through its label text instead.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
# the UI is a single-page app that fetches a lot on first load: this 2-core machine is slow
PAGE_TIMEOUT_MS = 120_000
STEP_TIMEOUT_MS = 60_000


class UIApprovalError(RuntimeError):
    """The approval could not be submitted through the UI (the message says where it stopped)."""


def chromium_available() -> bool:
    return os.access(CHROMIUM, os.X_OK)


def _field(dialog, title: str):
    """The form field whose label reads ``title`` (optionally followed by "(Optional)")."""
    label = re.compile(rf"^\s*{re.escape(title)}(\s*\(Optional\))?\s*$")
    scoped = dialog.locator(".schema-form-property").filter(
        has=dialog.page.locator(".schema-form-property__label", has_text=label)
    )
    return scoped.first


def _set_switch(dialog, title: str, value: bool) -> None:
    switch = _field(dialog, title).get_by_role("switch")
    switch.wait_for(timeout=STEP_TIMEOUT_MS)
    for _ in range(3):
        if (switch.get_attribute("aria-checked") == "true") == value:
            return
        switch.click()
        time.sleep(0.2)
    raise UIApprovalError(f"the {title!r} switch did not turn {'on' if value else 'off'}")


def _fill(dialog, title: str, text: str) -> None:
    box = _field(dialog, title).locator("textarea, input:not([type=checkbox]):not([type=hidden])").first
    box.wait_for(timeout=STEP_TIMEOUT_MS)
    box.fill(text)
    if box.input_value() != text:
        raise UIApprovalError(f"the {title!r} field holds {box.input_value()!r} after typing {text!r}")


def approve_in_ui(
    ui_url: str,
    flow_run_id: str,
    *,
    approve: bool,
    reviewer: str,
    comment: str,
    code: str = "",
    acknowledge_scan_review: bool = False,
    screenshot: Path | None = None,
    login: str | None = None,
) -> None:
    """Resume the paused flow run ``flow_run_id`` through the Prefect UI at ``ui_url``,
    first typing ``login`` (the server's ``user:password``) into the UI's login form when
    the server has authentication on.

    ``screenshot`` receives a PNG of the filled dialog (description and form) taken just
    before ``Submit``. Returns once the dialog has closed. Raises UIApprovalError naming the
    step that failed, with a screenshot of the page at that moment saved beside
    ``screenshot`` (or in the working directory) as ``*-failure.png``.
    """
    from playwright.sync_api import Error as PlaywrightError
    from playwright.sync_api import sync_playwright

    if not chromium_available():
        raise UIApprovalError(f"{CHROMIUM} is missing: `make test` installs it (apt-get install chromium)")
    url = f"{ui_url.rstrip('/')}/runs/flow-run/{flow_run_id}"
    failure_shot = (
        screenshot.with_name(f"{screenshot.stem}-failure.png")
        if screenshot
        else Path(f"ui-approval-{flow_run_id}-failure.png")
    )
    console: list[str] = []
    step = "launching chromium"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"], headless=True)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(STEP_TIMEOUT_MS)
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}") if m.type == "error" else None)
            try:
                if login is not None:
                    step = "logging in (the server has API authentication on)"
                    page.goto(f"{ui_url.rstrip('/')}/login", timeout=PAGE_TIMEOUT_MS)
                    password = page.get_by_placeholder("admin:pass")
                    password.wait_for(timeout=PAGE_TIMEOUT_MS)
                    password.fill(login)
                    page.get_by_role("button", name="Login", exact=True).click()
                    page.wait_for_url(lambda at: "/login" not in at, timeout=PAGE_TIMEOUT_MS)
                step = f"opening {url}"
                page.goto(url, timeout=PAGE_TIMEOUT_MS)
                resume = page.get_by_role("button", name="Resume", exact=True)
                step = "waiting for the Resume button (is the run paused?)"
                resume.wait_for(timeout=PAGE_TIMEOUT_MS)
                resume.click()
                step = "waiting for the Resume Flow Run dialog"
                dialog = page.get_by_role("dialog").filter(has_text="Resume Flow Run")
                dialog.wait_for()
                step = "setting the Approve switch"
                _set_switch(dialog, "Approve", approve)
                step = "filling Reviewer"
                _fill(dialog, "Reviewer", reviewer)
                step = "filling Code"
                _fill(dialog, "Code", code)
                step = "filling Comment"
                _fill(dialog, "Comment", comment)
                step = "setting the Acknowledge Scan Review switch"
                _set_switch(dialog, "Acknowledge Scan Review", acknowledge_scan_review)
                if screenshot is not None:
                    step = f"taking the screenshot {screenshot}"
                    screenshot.parent.mkdir(parents=True, exist_ok=True)
                    card = dialog.locator(".p-modal__card")
                    (card.first if card.count() else dialog).screenshot(path=str(screenshot))
                step = "submitting"
                dialog.get_by_role("button", name="Submit", exact=True).click()
                step = "waiting for the dialog to close (the server may have refused the input)"
                dialog.wait_for(state="hidden", timeout=PAGE_TIMEOUT_MS)
            except (PlaywrightError, UIApprovalError) as exc:
                try:
                    failure_shot.parent.mkdir(parents=True, exist_ok=True)
                    page.screenshot(path=str(failure_shot), full_page=True)
                    saved = f"screenshot: {failure_shot}"
                except PlaywrightError as shot_exc:
                    saved = f"no screenshot ({shot_exc})"
                errors = "\n  ".join(console[-10:]) or "(none)"
                raise UIApprovalError(
                    f"UI approval of {flow_run_id} failed while {step}: {exc}\n{saved}\n"
                    f"browser console errors:\n  {errors}"
                ) from exc
        finally:
            browser.close()
