"""The processes on this machine that run given Prefect flow runs: a worker starts each flow
run with its id in ``PREFECT__FLOW_RUN_ID``. What a waiting sign-off holds on its worker
(``tests/test_pipeline.py``, ``bench/scale_sign_off.py``)."""

from __future__ import annotations

from pathlib import Path


def processes_running(flow_run_ids: set[str]) -> list[int]:
    """PIDs of the processes whose environment names one of ``flow_run_ids``."""
    markers = {f"PREFECT__FLOW_RUN_ID={i}".encode() for i in flow_run_ids}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if markers & set((entry / "environ").read_bytes().split(b"\0")):
                found.append(int(entry.name))
        except OSError:  # ended while we looked, or not ours to read
            continue
    return found


def rss_mib(pids: list[int]) -> float:
    """Their resident memory in all, MiB (what has ended counts nothing)."""
    total_kib = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total_kib += int(line.split()[1])
        except OSError:
            continue
    return round(total_kib / 1024, 1)
