"""A job's webhook URL may carry credentials (``user:password@``, a token in the query): the
runner sends them to the endpoint, but its log and run store only ever see the redacted URL, also
when the post fails and the error's text echoes the URL in another spelling."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from streamling.bundle.runner import Runner

SECRETS = ("hook-secret", "hook-token-123")


class _Endpoint(BaseHTTPRequestHandler):
    seen: list[str] = []

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).seen.append(f"{self.path} {self.headers.get('Authorization', '')}")
        self.send_response(500 if self.path.startswith("/fail") else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def endpoint() -> Iterator[str]:
    _Endpoint.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stored_and_logged(runner: Runner, caplog: pytest.LogCaptureFixture) -> str:
    rows = [f"{r['target']} {r['status']} {r['detail']}" for r in runner.store.notifications(7)]
    return "\n".join(rows) + "\n" + caplog.text


def test_a_webhook_token_reaches_the_endpoint_but_never_the_store_or_the_log(
        tmp_path: Path, endpoint: str, caplog: pytest.LogCaptureFixture) -> None:
    runner = Runner(tmp_path / "root")
    urls = [f"http://ops:hook-secret@{endpoint}/ok?token=hook-token-123",
            f"http://{endpoint}/fail?token=hook-token-123",
            f"http://ops:hook-secret@127.0.0.1:{_closed_port()}/down?token=hook-token-123"]
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.WARNING, logger="httpx")  # as the runner's logging setup leaves httpx
    runner.notifications.send_webhooks(7, "on_failure", urls, {"event": "on_failure"})

    assert [s.split(" ")[0] for s in _Endpoint.seen] == ["/ok?token=hook-token-123", "/fail?token=hook-token-123"]
    assert "Basic " in _Endpoint.seen[0]  # the credentials were sent
    rows = runner.store.notifications(7)
    assert [(r["target"], r["status"], r["detail"]) for r in rows[:2]] == [
        (f"http://{endpoint}/ok?…", "sent", "HTTP 200"), (f"http://{endpoint}/fail?…", "failed", "HTTP 500")]
    assert rows[2]["target"].endswith("/down?…") and rows[2]["status"] == "failed"
    assert "webhook to http://" in caplog.text and "failed" in caplog.text
    text = _stored_and_logged(runner, caplog)
    assert not [s for s in SECRETS if s in text], text
    runner.store.close()


def test_an_error_echoing_the_url_in_another_spelling_is_masked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    def refuse(url: str, **_kwargs: Any) -> httpx.Response:
        # httpx normalises URLs: the text may not contain the URL as the user wrote it
        raise httpx.ConnectError(f"cannot reach http://ops:hook-secret@hooks.example.com:80/x?token=hook-token-123"
                                 f"&b=2 (Basic {'b3BzOmhvb2stc2VjcmV0'})")

    monkeypatch.setattr(httpx, "post", refuse)
    runner = Runner(tmp_path / "root")
    caplog.set_level(logging.DEBUG)
    runner.notifications.send_webhooks(7, "on_start",
                                       ["http://ops:hook-secret@hooks.example.com/x?b=2&token=hook-token-123"], {})

    [row] = runner.store.notifications(7)
    assert row["target"] == "http://hooks.example.com/x?…" and row["status"] == "failed"
    assert "cannot reach" in row["detail"]
    text = _stored_and_logged(runner, caplog)
    assert "b3BzOmhvb2stc2VjcmV0" not in text and not [s for s in SECRETS if s in text], text
    runner.store.close()
