"""Race tests: callers released at once by one barrier, each in a thread of its own."""

from __future__ import annotations

import threading
from collections.abc import Callable


def released_at_once(acts: list[Callable[[], None]], *, timeout_s: float = 120) -> list[BaseException]:
    """Run every one of ``acts`` in its own thread, all released together by a barrier;
    what they raised (an empty list when none did)."""
    barrier = threading.Barrier(len(acts))
    errors: list[BaseException] = []

    def run(act: Callable[[], None]) -> None:
        try:
            barrier.wait(timeout=30)
            act()
        except BaseException as e:  # noqa: BLE001 (returned to the caller)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(act,)) for act in acts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout_s)
    return errors
