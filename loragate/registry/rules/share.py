"""A canary's share: the fraction of an adapter's live requests its canary version answers.

A share is a finite number from 0 (a dark canary: only the probes reach it) to 1 (every
live request, the step before production moves). People write it as a fraction (``0.1``)
or a percentage (``10%``); everything else -- NaN, infinities, booleans, text that is
neither -- is refused as INVALID_SHARE before anything changes.

A share has a cap, the operator's ``LORAGATE_CANARY_MAX_SHARE`` (50 % by default): how many
users a canary may answer before a person has signed it off. Raising a window's share above
it is the promotion's own step -- every user to the canary, so the switch that follows moves
nobody -- and is refused (SHARE_ABOVE_CAP) unless a person's sign-off of the version is
redeemed and not yet applied, to a caller who may promote it. Lowering a share never needs
one: it only sends users back to production. The database holds the roles' users to the
same rule against its own copy of the cap (migration 0012).
"""

from __future__ import annotations

import math

from loragate.registry.errors import ErrorCode, InvalidInput, PermissionDenied


def check_share(value: object, *, field: str = "share") -> float:
    """``value`` as a share.

    Raises:
        InvalidInput: INVALID_SHARE naming ``field``, for anything but a finite number in [0, 1].
    """
    # bool is an int: True must not read as a 100 % share
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(
            f"{field} must be a number from 0 to 1, not {type(value).__name__}",
            code=ErrorCode.INVALID_SHARE,
            field=field,
        )
    share = float(value)
    if not math.isfinite(share) or not 0.0 <= share <= 1.0:
        raise InvalidInput(
            f"{field} must be from 0 to 1 (a fraction), not {share!r}", code=ErrorCode.INVALID_SHARE, field=field
        )
    return share


def parse_share(text: str, *, field: str = "share") -> float:
    """A share written by a person: ``0.1`` or ``10%`` (both a tenth of live requests).

    Raises:
        InvalidInput: INVALID_SHARE naming ``field``, for text that is neither, or out of range.
    """
    written = text.strip()
    percent = written.endswith("%")
    try:
        number = float(written[:-1] if percent else written)
    except ValueError:
        raise InvalidInput(
            f"{field} must be a fraction from 0 to 1 or a percentage such as 10%, not {text[:40]!r}",
            code=ErrorCode.INVALID_SHARE,
            field=field,
        ) from None
    if percent:
        if not math.isfinite(number) or not 0.0 <= number <= 100.0:
            raise InvalidInput(
                f"{field} must be from 0% to 100%, not {text[:40]!r}", code=ErrorCode.INVALID_SHARE, field=field
            )
        return number / 100.0
    return check_share(number, field=field)


def needs_sign_off(share: float, current: float, cap: float) -> bool:
    """Whether moving a window's share from ``current`` to ``share`` takes a person's
    sign-off: raising it above ``cap``."""
    return share > cap and share > current


def above_cap(share: float, cap: float, version_id: str, *, field: str = "share") -> PermissionDenied:
    """The refusal of a share above the cap (nothing changed)."""
    return PermissionDenied(
        f"{share:.2%} of live requests to {version_id} is above LORAGATE_CANARY_MAX_SHARE ({cap:.2%}): "
        "only the promotion raises it, on a person's sign-off redeemed and not yet applied",
        code=ErrorCode.SHARE_ABOVE_CAP,
        field=field,
    )
