"""The sign-off form a production promotion waits on.

A sign-off waits on ``Approval.with_initial_data(description=...)`` (``flows/waiting.py``):
the Prefect UI renders this model as a form beside the waiting run, with the canary
evidence as its description; ``loragate approve`` answers the same wait with the same fields. The
approval code proves who decides: ``loragate approve-code VERSION`` issues it to the
reviewer's own activation token, and the flow redeems it before it records or moves
anything (``registry/rules/approvals.py``). A version whose weight scan asked for review
needs ``acknowledge_scan_review``: without it the flow asks again.
Reviewer and comment reach the audit log, the logs and Slack with control characters
escaped: a comment cannot forge a line of history.
"""

from __future__ import annotations

from prefect.input import RunInput
from pydantic import Field, field_validator

from loragate.registry.rules.text import printable


class Approval(RunInput):
    approve: bool = Field(default=False, description="Promote this canary to production")
    # required: a resume without a reviewer is refused and the run stays paused
    reviewer: str = Field(min_length=1, pattern=r"\S", description="Who decides (recorded in the audit log)")
    # the proof: issued to the reviewer's own activation token, for this version and decision
    code: str = Field(
        default="",
        description="Approval code from `loragate approve-code VERSION` (or `--reject`), issued to your "
        "own activation token: single-use, it expires; without it nothing is recorded",
    )
    comment: str = Field(default="", description="Why (recorded in the audit log)")
    # a version whose weight scan asked for review is promoted only with this set
    acknowledge_scan_review: bool = Field(
        default=False,
        description="I have read the weight scan's review reasons above and promote anyway "
        "(required when the scan asked for review; recorded in the audit log)",
    )

    @field_validator("reviewer", "comment")
    @classmethod
    def _one_printable_line(cls, value: str) -> str:
        return printable(value)
