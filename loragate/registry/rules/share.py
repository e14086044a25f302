"""A canary's share: the fraction of an adapter's live requests its canary version answers.

A share is a finite number from 0 (a dark canary: only the probes reach it) to 1 (every
live request, the step before production moves). People write it as a fraction (``0.1``)
or a percentage (``10%``); everything else -- NaN, infinities, booleans, text that is
neither -- is refused as INVALID_SHARE before anything changes.
"""

from __future__ import annotations

import math

from loragate.registry.errors import ErrorCode, InvalidInput


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
