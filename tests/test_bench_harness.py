"""What the benchmarks that drive running replicas leave behind: the replicas pointed back at
the registry they read before, and no scratch directory, even when a replica's late read of
the run's SQLite registry creates its files again behind the removal."""

from __future__ import annotations

import shutil

import pytest

from bench import harness
from loragate.local.replica_secrets import write_replica_secrets
from tests.test_bench_smoke import secrets_of


def test_running_replicas_secrets_are_put_back_as_they_were_when_the_run_ends(tmp_path):
    secrets = write_replica_secrets(tmp_path / "secrets", "session-key", "sqlite:////session/registry.db")
    before = secrets_of(secrets)
    with pytest.raises(RuntimeError), harness.secrets_put_back(secrets):
        write_replica_secrets(secrets, "run-key", "sqlite:////run/registry.db")
        raise RuntimeError("the run failed")
    assert secrets_of(secrets) == before


def test_a_file_created_again_behind_the_removal_is_removed_on_the_next_try(monkeypatch):
    real_rmtree = shutil.rmtree
    tries = []

    def racing_rmtree(path, *args, **kwargs):
        # what a replica's read does: it opened registry.db before the removal, and creates
        # the -wal file after the removal listed the directory
        tries.append(path)
        if len(tries) == 1:
            (path / "registry.db").unlink()
            (path / "registry.db-wal").write_text("")
            raise OSError(39, "Directory not empty", str(path))
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(harness.shutil, "rmtree", racing_rmtree)
    monkeypatch.setattr(harness.time, "sleep", lambda s: None)
    with harness.work_directory("loragate-test-") as work:
        (work / "registry.db").write_text("")
    assert len(tries) == 2 and not work.exists()


def test_a_directory_that_keeps_coming_back_fails_the_run_after_the_deadline(monkeypatch):
    def never_empty(path, *args, **kwargs):
        raise OSError(39, "Directory not empty", str(path))

    monkeypatch.setattr(harness.shutil, "rmtree", never_empty)
    monkeypatch.setattr(harness.time, "sleep", lambda s: None)
    with pytest.raises(OSError), harness.work_directory("loragate-test-", deadline_s=0.0) as work:
        pass
    work.rmdir()


def test_users_asking_again_through_the_balancer_are_answered_by_the_other_replica():
    # an even pass sent every user back to the upstream it had (the smoke's 100 + 30
    # requests per share): across-replica stickiness went unmeasured
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import httpx

    from bench.traffic_balancer import round_robin

    class Upstream(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Upstream) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        urls = [f"http://127.0.0.1:{s.server_address[1]}" for s in servers]
        with round_robin(urls) as balancer, httpx.Client() as http:

            def upstreams_of(n):
                return [http.get(f"{balancer.url}/v1/models").headers["x-bench-upstream"] for _ in range(n)]

            balancer.start_at(0)
            first = upstreams_of(4)
            balancer.start_at(1)
            again = upstreams_of(4)
        assert first == ["0", "1", "0", "1"]
        assert again == ["1", "0", "1", "0"]
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
