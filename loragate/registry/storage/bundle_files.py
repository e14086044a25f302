"""A bundle's files on disk: their names, and opening a file only if it is a regular one.

An adapter bundle is three files (``WEIGHTS_FILE``, ``ADAPTER_CONFIG_FILE``,
``MANIFEST_FILE``), the same names wherever they lie -- the source a tenant registers, the
stored copy, a replica's copy a signature covers. Whoever reads one opens it without
blocking and checks what it opened: a FIFO, a device or a directory in a file's place is
refused, never waited on.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from loragate.registry.errors import ErrorCode, InvalidInput

WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"
MANIFEST_FILE = "manifest.json"
BUNDLE_FILES = (WEIGHTS_FILE, ADAPTER_CONFIG_FILE, MANIFEST_FILE)


def open_regular(path: Path, *, field: str, code: ErrorCode = ErrorCode.INVALID_BUNDLE, follow: bool = False) -> int:
    """A descriptor on ``path``, which must be a regular file; never blocks.

    Opening a FIFO for reading blocks until a writer appears, so the file is opened
    non-blocking and only then ``fstat``-ed: what is checked is what was opened.

    Raises:
        InvalidInput: ``code`` when the path cannot be opened or is not a regular file.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise InvalidInput(f"{field} does not exist", code=code, field=field) from None
    except OSError as e:
        raise InvalidInput(f"cannot open {field}: {e.strerror}", code=code, field=field) from e
    kind = stat.S_IFMT(os.fstat(fd).st_mode)
    if kind != stat.S_IFREG:
        os.close(fd)
        what = {stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a directory", stat.S_IFSOCK: "a socket"}.get(kind, "a device")
        raise InvalidInput(f"{field} is {what}, not a regular file", code=code, field=field)
    os.set_blocking(fd, True)
    return fd


def read_regular_file(path: Path, limit: int, *, field: str, code: ErrorCode = ErrorCode.INVALID_BUNDLE) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (symlinks followed).

    Raises:
        InvalidInput: ``code`` for what is not a readable regular file; TOO_LARGE past ``limit``.
    """
    with os.fdopen(open_regular(Path(path), field=field, code=code, follow=True), "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise InvalidInput(f"{path} is over the {limit}-byte limit", code=ErrorCode.TOO_LARGE, field=field)
    return data
