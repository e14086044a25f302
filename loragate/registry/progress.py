"""Progress: how a long operation tells its caller what it is doing, one line at a time.

Every step that takes long or touches many things -- registering a bundle, validating a
batch, switching a stage's replicas, a canary's moves -- takes a ``progress`` callable and
hands it a line per step. The caller decides where lines go: the shell prints them, a
Prefect task logs them with its run's logger, a test collects them; ``quiet`` drops them.
It lives at the bottom of the layers so the registry and every layer above share it.
"""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[str], None]


def quiet(_: str) -> None:
    """The default ``progress``: lines no one asked for are dropped."""
