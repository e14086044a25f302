"""Names of logical adapters and base models.

A logical adapter is ``<namespace>/<base>/<task>``; each segment is lower-case letters,
digits, ``-``, ``_`` and inner dots, so a name can never be a path trick (``..``,
``a//b``, a leading dot or slash) wherever it ends up: a URL, a directory, a vLLM
``lora_name``. The base segment is the catalog id of the base model the adapter is bound to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from loragate.registry.errors import ErrorCode, InvalidInput

_SEGMENT = re.compile(r"^[a-z0-9](?:[a-z0-9._-]{0,62}[a-z0-9])?$")
MAX_NAME_LENGTH = 3 * 64 + 2


def check_segment(value: object, *, what: str, field: str) -> str:
    """Raises:
    InvalidInput: INVALID_NAME.
    """
    if not isinstance(value, str) or not _SEGMENT.match(value) or ".." in value:
        raise InvalidInput(
            f"{what} {value!r} must be 1-64 of [a-z0-9._-], start and end alphanumeric, no '..'",
            code=ErrorCode.INVALID_NAME,
            field=field,
        )
    return value


def check_base_id(value: object, field: str = "base_model_id") -> str:
    return check_segment(value, what="base model id", field=field)


@dataclass(frozen=True)
class AdapterName:
    namespace: str
    base: str
    task: str

    @classmethod
    def parse(cls, value: object, field: str = "name") -> AdapterName:
        """Raises:
        InvalidInput: INVALID_NAME for anything but ``<namespace>/<base>/<task>``.
        """
        if not isinstance(value, str) or len(value) > MAX_NAME_LENGTH:
            raise InvalidInput(
                f"adapter name {value!r} is not a string of sane length", code=ErrorCode.INVALID_NAME, field=field
            )
        parts = value.split("/")
        if len(parts) != 3:
            raise InvalidInput(
                f"adapter name {value!r} must be <namespace>/<base>/<task>",
                code=ErrorCode.INVALID_NAME,
                field=field,
            )
        for part, what in zip(parts, ("namespace", "base", "task"), strict=True):
            check_segment(part, what=f"{what} segment of {value!r}", field=field)
        return cls(*parts)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.base}/{self.task}"
