"""A paused flow run is approved (or rejected) by a person in the Prefect UI: tested in a real browser.

A flow pauses on ``loragate.flows.approval.Approval`` against a real ``prefect server start``;
headless Chromium opens the run's page, clicks Resume, fills the rendered form and
submits it; the flow must resume with exactly what was typed, approval code included (what
the promote flow does with a code is tests/test_pipeline.py and tests/test_gate_quality.py). The filled dialog is
screenshotted (under ``tmp_path`` and copied to the git-ignored ``tests/artifacts/``).
Chromium missing is a failure, never a skip: ``make test`` installs it.
"""

from __future__ import annotations

import queue
import shutil
import threading
import uuid
from pathlib import Path

import pytest
from prefect import flow, pause_flow_run
from prefect.runtime import flow_run

from loragate.flows.approval import Approval
from tests.support.browser import approve_in_ui, chromium_available
from tests.support.prefect_env import client_env, prefect_server_fixture, wait_for_state  # noqa: F401  (a fixture)

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parent / "artifacts"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DESCRIPTION = "## Canary evidence\n\n| replica | errors | p95 ms |\n|---|---|---|\n| r1 | 0 | 41 |\n\nPromote?"

# flow run ids handed from the flow (in its thread) to the test, by a token the test picks
_RUN_IDS: dict[str, queue.Queue[str]] = {}


@flow(name="ui-approval-probe", persist_result=False)
def wait_for_approval(token: str) -> dict:
    _RUN_IDS[token].put(flow_run.id)
    answer = pause_flow_run(
        wait_for_input=Approval.with_initial_data(description=DESCRIPTION, approve=False),
        key="approval",
        poll_interval=1,
        timeout=300,
    )
    return answer.model_dump()


class PausedRun:
    """``wait_for_approval`` running in a thread of its own against the test server."""

    def __init__(self, server) -> None:
        self.token = uuid.uuid4().hex
        _RUN_IDS[self.token] = queue.Queue()
        self.outcome: dict = {}
        self.thread = threading.Thread(target=self._run, args=(server,), daemon=True)
        self.thread.start()
        self.id = _RUN_IDS[self.token].get(timeout=120)
        wait_for_state(server, self.id, "PAUSED", timeout_s=120)

    def _run(self, server) -> None:
        try:
            with client_env(server):
                self.outcome["result"] = wait_for_approval(self.token)
        except BaseException as exc:  # reported by result()
            self.outcome["error"] = exc

    def result(self, timeout_s: float = 120) -> dict:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), f"flow run {self.id} did not finish within {timeout_s:.0f} s of the approval"
        if "error" in self.outcome:
            raise self.outcome["error"]
        return self.outcome["result"]


@pytest.fixture
def browser_ready() -> None:
    if not chromium_available():
        pytest.fail("/usr/bin/chromium is missing: `make test` installs it (apt-get install chromium)")


def _keep(screenshot: Path, name: str) -> None:
    assert screenshot.read_bytes()[:8] == PNG_MAGIC, f"{screenshot} is not a PNG"
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(screenshot, ARTIFACTS / name)


@pytest.mark.parametrize(
    "approve, reviewer, code, comment, acknowledge, kept",
    [
        (
            True,
            "alice",
            "lac_0123456789ab_" + "x" * 22,
            "canary clean for 30 min; promote",
            True,
            "ui-approval-approve.png",
        ),
        (False, "bob", "lac_ba9876543210_" + "y" * 22, "p95 drifted on r2", False, "ui-approval-reject.png"),
    ],
    ids=["approve-acknowledging-a-scan-review", "reject"],
)
def test_the_ui_form_resumes_the_run_with_what_the_reviewer_chose_and_typed(
    browser_ready, prefect_server, tmp_path, approve, reviewer, code, comment, acknowledge, kept
):
    run = PausedRun(prefect_server)
    shot = tmp_path / "dialog.png"

    approve_in_ui(
        prefect_server.ui_url,
        str(run.id),
        approve=approve,
        reviewer=reviewer,
        comment=comment,
        code=code,
        acknowledge_scan_review=acknowledge,
        screenshot=shot,
        login=prefect_server.auth_string,
    )

    assert run.result() == {
        "approve": approve,
        "reviewer": reviewer,
        "code": code,
        "comment": comment,
        "acknowledge_scan_review": acknowledge,
    }
    wait_for_state(prefect_server, run.id, "COMPLETED", timeout_s=30)
    _keep(shot, kept)
