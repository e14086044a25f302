"""What a bad disk or a hand on a replica host does to a file: one byte flipped in place,
its size and mtime as they were, so only its content (and its ctime, which only the kernel
sets) tells. Used by the demo and the tests of verified replica copies."""

from __future__ import annotations

import os
from pathlib import Path


def flip_a_byte(path: Path) -> None:
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
