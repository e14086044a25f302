"""What `make demo` prints and runs, step by step: banners and lines stamped with the
seconds since the demo started, the `loragate` commands it shows, and waits that say what
they waited for and how long."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HOME = Path(".loragate").resolve()
STARTED = time.monotonic()


def banner(text: str) -> None:
    print(f"\n=== [{time.monotonic() - STARTED:5.0f}s] {text} " + "=" * max(0, 62 - len(text)), flush=True)


def say(text: str) -> None:
    print(f"  [{time.monotonic() - STARTED:5.0f}s] {text}", flush=True)


def loragate(*args: str, expect: int = 0, quiet: bool = False, env: dict[str, str] | None = None) -> str:
    cmd = [str(Path(sys.executable).parent / "loragate"), *args]
    print("$ loragate " + " ".join(args), flush=True)
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, **(env or {}), "LORAGATE_PROGRESS": "1"}
    )
    if proc.stderr.strip():
        print("\n".join("  " + line for line in proc.stderr.strip().splitlines()))
    if proc.stdout.strip() and not quiet:
        print(proc.stdout.rstrip())
    if proc.returncode != expect:
        raise SystemExit(f"demo: `loragate {' '.join(args)}` exited {proc.returncode}, expected {expect}")
    return proc.stdout.strip()


def wait_for(what: str, check: Callable[[], Any], timeout_s: float = 240.0, every_s: float = 1.0) -> Any:
    """Poll ``check`` until it returns something truthy; say what is awaited, and how long it took."""
    t0 = time.monotonic()
    while True:
        found = check()
        if found:
            say(f"{what} ({time.monotonic() - t0:.0f}s)")
            return found
        if time.monotonic() - t0 > timeout_s:
            raise SystemExit(f"demo: gave up waiting for {what} after {timeout_s:.0f}s (logs under {HOME})")
        time.sleep(every_s)
