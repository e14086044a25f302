"""A recording Slack for tests: a real HTTP server on 127.0.0.1 that answers
``POST /api/chat.postMessage`` the way Slack's Web API does.

slack-sdk's ``WebClient(base_url=slack.base_url)`` talks to it over real HTTP. Every post
that arrives is recorded -- channel, text, blocks, whether it carried a bearer token (never
the token itself) -- and answered ``{"ok": true, "channel": ..., "ts": ...}``, unless it
breaks Slack's Block Kit limits (answered ``invalid_blocks``, as Slack does) or the server
was told to fail the next calls: Slack's own refusal (``channel_not_found``), an HTTP 500
page, or a dropped connection after the post was read -- the case where Slack may have
posted and the client cannot know.

Use the ``slack`` fixture: ``from tests.support.slack import slack  # noqa: F401``.
"""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import parse_qs

import pytest

POST_MESSAGE = "/api/chat.postMessage"
HEADER_MAX = 150
SECTION_MAX = 3000


class Failure(StrEnum):
    SLACK_ERROR = "slack-error"  # 200 {"ok": false, "error": "channel_not_found"}
    HTTP_500 = "http-500"  # a non-JSON error page
    DROP = "drop"  # the post is read, then the connection closes without an answer


@dataclass(frozen=True)
class Message:
    channel: str
    text: str
    blocks: list[dict[str, Any]]
    authorized: bool  # an "Authorization: Bearer ..." header came with it
    answered: str  # "ok", "invalid_blocks" or the Failure it met


@dataclass
class RecordingSlack:
    port: int = 0
    messages: list[Message] = field(default_factory=list)
    _failures: list[Failure] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        slack = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                body = self.rfile.read(int(self.headers.get("content-length", 0) or 0))
                if self.path.split("?")[0] != POST_MESSAGE:
                    self._answer(404, {"ok": False, "error": "unknown_method"})
                    return
                fields = _parse(self.headers.get("content-type", ""), body)
                failure = slack._next_failure()
                answered = failure.value if failure else _block_kit_error(fields.get("blocks") or []) or "ok"
                slack._record(
                    Message(
                        channel=str(fields.get("channel", "")),
                        text=str(fields.get("text", "")),
                        blocks=list(fields.get("blocks") or []),
                        authorized=self.headers.get("authorization", "").startswith("Bearer "),
                        answered=answered,
                    )
                )
                if failure == Failure.DROP:
                    self.close_connection = True
                elif failure == Failure.HTTP_500:
                    self._answer(500, b"<html>Internal Server Error</html>", "text/html")
                elif failure == Failure.SLACK_ERROR:
                    self._answer(200, {"ok": False, "error": "channel_not_found"})
                elif answered != "ok":
                    self._answer(200, {"ok": False, "error": answered})
                else:
                    ts = f"{time.time():.6f}"
                    self._answer(200, {"ok": True, "channel": fields.get("channel"), "ts": ts})

            def _answer(
                self, status: int, body: dict[str, Any] | bytes, content_type: str = "application/json"
            ) -> None:
                raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", content_type)
                self.send_header("content-length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api/"

    def fail(self, failure: Failure, times: int = 1) -> None:
        """Fail the next ``times`` posts this way (each is still recorded)."""
        with self._lock:
            self._failures += [failure] * times

    def clear(self) -> None:
        with self._lock:
            self.messages.clear()
            self._failures.clear()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _next_failure(self) -> Failure | None:
        with self._lock:
            return self._failures.pop(0) if self._failures else None

    def _record(self, message: Message) -> None:
        with self._lock:
            self.messages.append(message)


def _parse(content_type: str, body: bytes) -> dict[str, Any]:
    """slack-sdk posts JSON for chat.postMessage, form fields for other calls."""
    if content_type.startswith("application/json"):
        return dict(json.loads(body or b"{}"))
    fields: dict[str, Any] = {k: v[0] for k, v in parse_qs(body.decode()).items()}
    if isinstance(fields.get("blocks"), str):
        fields["blocks"] = json.loads(fields["blocks"])
    return fields


def _block_kit_error(blocks: list[dict[str, Any]]) -> str | None:
    """Slack refuses a whole message whose blocks break these limits."""
    for block in blocks:
        text = block.get("text", {}).get("text", "")
        if block.get("type") == "header" and (block["text"].get("type") != "plain_text" or len(text) > HEADER_MAX):
            return "invalid_blocks"
        if block.get("type") == "section" and len(text) > SECTION_MAX:
            return "invalid_blocks"
    return None


@pytest.fixture
def slack() -> Iterator[RecordingSlack]:
    server = RecordingSlack()
    try:
        yield server
    finally:
        server.close()
