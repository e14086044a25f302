"""Free text people write into the audit log: reasons and token holders.

What is written there is printed later by ``loragate history``, shown in the Prefect UI and
posted to Slack. A newline or an ANSI escape in a reason would let its writer forge lines of
history (a fake approval by someone else), so such characters are refused where the text
comes in, and escaped wherever stored text is printed (rows written before this rule).
"""

from __future__ import annotations

import unicodedata

from loragate.registry.errors import ErrorCode, InvalidInput

# generous: a gate's own reasons name every monitor out of band
MAX_REASON = 2000


def _is_control(ch: str) -> bool:
    # Cc: C0/C1 controls (newline, ESC); Cf: format characters such as the bidi overrides
    # that reorder what a terminal shows; Cs/Co/Cn: nothing a person types
    return unicodedata.category(ch).startswith("C")


def check_text(value: str | None, *, field: str, limit: int | None = MAX_REASON) -> str | None:
    """``value`` unchanged, or None for None.

    Raises:
        InvalidInput: INVALID_TEXT when it holds a control or format character or is
            longer than ``limit`` (None: a caller with a length rule of its own).
    """
    if value is None:
        return None
    bad = next((ch for ch in value if _is_control(ch)), None)
    if bad is not None:
        raise InvalidInput(
            f"{field} must be one line of printable text: it holds {bad!r} (U+{ord(bad):04X})",
            code=ErrorCode.INVALID_TEXT,
            field=field,
        )
    if limit is not None and len(value) > limit:
        raise InvalidInput(
            f"{field} is {len(value)} characters; at most {limit}", code=ErrorCode.INVALID_TEXT, field=field
        )
    return value


def printable(value: str | None) -> str:
    """``value`` with every control or format character shown as an escape (``\\n``,
    ``\\x1b``, ``\\u202e``): safe to print on one terminal line."""
    if not value:
        return value or ""
    return "".join(ch.encode("unicode_escape").decode("ascii") if _is_control(ch) else ch for ch in value)
