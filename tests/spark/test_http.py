"""``handler`` transform and ``webhook`` sink against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from streamling.errors import StreamlingError
from streamling.runtime.nodes import Epoch, Sink
from streamling.spec import nodes as spec_nodes

pytestmark = pytest.mark.spark

SECRET = "s3cr3t-token-value"


class Endpoint:
    """A tiny app: records every request and answers according to the path.

    ``/enrich`` adds ``doubled`` (= id * 2) and ``seen_at`` to each row (v0 or v1 shape, object or
    array) after a random pause so answers finish out of order; ``/flaky`` fails each distinct body
    with 503, then 429, then a dropped connection before enriching it; ``/status/<code>`` always
    answers ``code``.
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.attempts: dict[bytes, int] = {}
        self.lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                pass

            def do_POST(self) -> None:  # noqa: N802 - stdlib naming
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with endpoint.lock:
                    endpoint.requests.append({"path": self.path, "headers": dict(self.headers),
                                              "body": json.loads(body)})
                    attempt = endpoint.attempts[body] = endpoint.attempts.get(body, 0) + 1
                if self.path == "/text":
                    data = b"<html>ok</html>"
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                elif self.path.startswith("/status/"):
                    self.answer(int(self.path.rsplit("/", 1)[1]), {"error": "nope", "echo": dict(self.headers)})
                elif self.path == "/flaky" and attempt <= 3:
                    if attempt == 3:
                        self.close_connection = True
                        self.connection.shutdown(2)  # no answer at all: a transport error
                        return
                    self.answer(503 if attempt == 1 else 429, {"error": "busy"}, retry_after="0")
                else:
                    time.sleep(random.random() * 0.005)
                    self.answer(200, enrich(json.loads(body)))

            def answer(self, status: int, payload: Any, retry_after: str | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if retry_after is not None:
                    self.send_header("Retry-After", retry_after)
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # the default of 5 resets connections when many open at once
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def bodies(self, path: str) -> list[Any]:
        return [r["body"] for r in self.requests if r["path"] == path]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def enrich(body: Any) -> Any:
    if isinstance(body, list):
        return [enrich(item) for item in body]
    if "data" in body and "metadata" in body:
        return {"metadata": body["metadata"], "data": enrich(body["data"])}
    return {**body, "doubled": body["id"] * 2, "seen_at": "2026-02-03T04:05:06+00:00"}


@pytest.fixture
def endpoint() -> Iterator[Endpoint]:
    server = Endpoint()
    yield server
    server.close()


class CaptureSinkOptions(spec_nodes.FromNodeOptions):
    type: str = "capture"


class CaptureSink(Sink):
    """Keeps every row it receives, in the order Spark returns them."""

    rows: dict[str, list[dict[str, Any]]] = {}

    def write(self, df: Any, epoch: Epoch) -> int:
        rows = [r.asDict() for r in df.collect()]
        CaptureSink.rows.setdefault(self.name, []).extend(rows)
        return len(rows)


@pytest.fixture
def capture(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[dict[str, Any]]]:
    CaptureSink.rows = {}
    monkeypatch.setitem(spec_nodes.REGISTRY["sink"], "capture",
                        spec_nodes.NodeType("sink", "capture", CaptureSinkOptions, f"{__name__}:CaptureSink"))
    return CaptureSink.rows


FAST_RETRY = {"max_attempts": 5, "initial_backoff_ms": 10, "max_backoff_ms": 50}


def test_handler_v0_batches_keep_row_order_and_apply_schema_override(runner, endpoint, capture):
    runner.run(f"""
        sources:
          s: {{type: generate, rows: 300, rows_per_batch: 150, partitions: 3}}
        transforms:
          enrich:
            type: handler
            from: s
            url: {endpoint.url}/enrich
            batch_size: 7
            schema_override: {{doubled: int64, seen_at: timestamp, amount: string, customer: null}}
        sinks:
          raw: {{type: capture, from: s}}
          out: {{type: capture, from: enrich}}
    """, external_http_handler={"buffer_size": 4})
    raw, out = capture["raw"], capture["out"]
    assert len(out) == 300
    assert [r["id"] for r in out] == [r["id"] for r in raw]  # same order as the rows that produced them
    assert list(out[0]) == ["id", "country", "amount", "quantity", "created_at", "_gs_op", "doubled", "seen_at"]
    assert all(r["doubled"] == 2 * r["id"] and r["_gs_op"] == "i" for r in out)
    assert out[1]["amount"] == str(raw[1]["amount"]) and out[0]["seen_at"].year == 2026
    bodies = endpoint.bodies("/enrich")
    assert all(isinstance(b, list) and 1 <= len(b) <= 7 for b in bodies)
    assert sum(len(b) for b in bodies) == 300
    first = bodies[0][0]
    assert set(first) == {"id", "customer", "country", "amount", "quantity", "created_at", "_gs_op"}
    assert first["created_at"].startswith("2026-01-01T") and first["_gs_op"] == "i"


def test_handler_v1_one_row_per_request(runner, endpoint, capture):
    runner.run(f"""
        sources:
          s: {{type: generate, rows: 40, profile: cdc}}
        transforms:
          enrich: {{type: handler, from: s, url: "{endpoint.url}/enrich", one_row_per_request: true,
                    payload_version: 1, schema_override: {{doubled: int32}}}}
        sinks:
          raw: {{type: capture, from: s}}
          out: {{type: capture, from: enrich}}
    """)
    raw, out = capture["raw"], capture["out"]
    key = ("id", "version", "_gs_op")
    assert [tuple(r[k] for k in key) for r in out] == [tuple(r[k] for k in key) for r in raw]
    assert len({r["_gs_op"] for r in raw}) > 1  # the cdc profile mixes i/u/d: each op is carried through
    assert all(r["doubled"] == 2 * r["id"] for r in out)
    bodies = endpoint.bodies("/enrich")
    assert len(bodies) == 40
    # Streamling's v1 envelope carries the op twice: metadata.op and the row's own _gs_op in data
    assert all(set(b) == {"metadata", "data"} and b["data"]["_gs_op"] == b["metadata"]["op"] for b in bodies)
    sent = sorted((b["data"]["id"], b["data"]["version"], b["metadata"]["op"]) for b in bodies)
    assert sent == sorted((r["id"], r["version"], r["_gs_op"]) for r in raw)


def test_handler_retries_transient_failures(runner, endpoint, capture):
    runner.run(f"""
        sources:
          s: {{type: generate, rows: 20}}
        transforms:
          enrich: {{type: handler, from: s, url: "{endpoint.url}/flaky", batch_size: 5,
                    schema_override: {{doubled: int64}}}}
        sinks:
          out: {{type: capture, from: enrich}}
    """, retry=FAST_RETRY)
    assert sorted(r["doubled"] for r in capture["out"]) == [2 * i for i in range(20)]
    assert set(endpoint.attempts.values()) == {4}  # 503, 429, dropped connection, then success


def test_handler_names_node_url_and_status_when_retries_run_out_without_the_secret(runner, endpoint):
    runner.environ.update({"STREAMLING__HTTP_SECRET_HEADER__API": "X-Api-Key",
                           "STREAMLING__HTTP_SECRET_VALUE__API": SECRET})
    with pytest.raises(StreamlingError) as info:
        runner.run(f"""
            sources:
              s: {{type: generate, rows: 3}}
            transforms:
              enrich: {{type: handler, from: s, url: "{endpoint.url}/status/503", secret_name: api}}
            sinks:
              out: {{type: blackhole, from: enrich}}
        """, retry={"max_attempts": 2, "initial_backoff_ms": 10, "max_backoff_ms": 10})
    headline = info.value.headline()
    assert headline.startswith(f"handler transform 'enrich': POST {endpoint.url}/status/503 failed with HTTP 503 "
                               "after 2 attempts")
    assert endpoint.requests[0]["headers"]["X-Api-Key"] == SECRET  # it was sent…
    assert SECRET not in info.value.describe(debug=True)  # …but the server's echo of it is masked
    assert "***" in headline


def test_handler_does_not_retry_client_errors(runner, endpoint):
    with pytest.raises(StreamlingError) as info:
        runner.run(f"""
            sources:
              s: {{type: generate, rows: 2}}
            transforms:
              enrich: {{type: handler, from: s, url: "{endpoint.url}/status/400"}}
            sinks:
              out: {{type: blackhole, from: enrich}}
        """, retry=FAST_RETRY)
    assert f"POST {endpoint.url}/status/400 was rejected with HTTP 400" in info.value.headline()
    assert set(endpoint.attempts.values()) == {1}  # each request once (the partitions send in parallel)


def test_webhook_sends_v0_batches_and_v1_rows(runner, endpoint, caplog):
    runner.environ.update({"STREAMLING__HTTP_SECRET_HEADER__HOOK": "Authorization",
                           "STREAMLING__HTTP_SECRET_VALUE__HOOK": SECRET})
    runner.run(f"""
        sources:
          s: {{type: generate, rows: 25, profile: cdc}}
        sinks:
          batched: {{type: webhook, from: s, url: "{endpoint.url}/enrich", batch_size: 10, secret_name: hook,
                     headers: {{X-Source: streamling}}}}
          single: {{type: webhook, from: s, url: "{endpoint.url}/flaky", one_row_per_request: true,
                    payload_version: 1}}
    """, retry=FAST_RETRY)
    batched = [r for r in endpoint.requests if r["path"] == "/enrich"]
    assert sorted(len(r["body"]) for r in batched) == [5, 10, 10]  # sent concurrently: arrival order varies
    rows = sorted((row["id"], row["version"]) for r in batched for row in r["body"])
    assert len(rows) == 25 and set(rows) == {(b["data"]["id"], b["data"]["version"]) for b in endpoint.bodies("/flaky")}
    assert all(r["headers"]["Authorization"] == SECRET and r["headers"]["X-Source"] == "streamling" for r in batched)
    single = endpoint.bodies("/flaky")
    assert len({json.dumps(b) for b in single}) == 25 and len(single) == 100  # each row: 3 failures, 1 success
    assert all(set(b) == {"metadata", "data"} and set(b["metadata"]) == {"op"} for b in single)
    assert "retrying" in caplog.text and SECRET not in caplog.text


def test_webhook_skip_on_error_continues_past_5xx_but_not_by_default(runner, endpoint):
    runner.run(f"""
        sources:
          s: {{type: generate, rows: 4}}
        sinks:
          hook: {{type: webhook, from: s, url: "{endpoint.url}/status/500", one_row_per_request: true,
                  skip_on_error: true}}
    """, retry=FAST_RETRY)
    assert len(endpoint.requests) == 4  # each row tried once and skipped
    with pytest.raises(StreamlingError) as info:
        runner.run(f"""
            sources:
              s: {{type: generate, rows: 4}}
            sinks:
              hook: {{type: webhook, from: s, url: "{endpoint.url}/status/502"}}
        """, retry={"max_attempts": 3, "initial_backoff_ms": 10, "max_backoff_ms": 10}, application_id="again")
    assert info.value.headline().startswith(
        f"webhook sink 'hook': POST {endpoint.url}/status/502 failed with HTTP 502 after 3 attempts")


@pytest.mark.parametrize(("path", "override", "expected"), [
    ("/text", "{}", "answered HTTP 200 with a body that is not JSON: <html>ok</html> — the endpoint must answer"),
    ("/enrich", "{customer: int64}", "response field 'customer' does not fit type int64 (e.g. 'customer-"),
])
def test_handler_answers_that_do_not_fit_name_the_problem(runner, endpoint, path, override, expected):
    with pytest.raises(StreamlingError) as info:
        runner.run(f"""
            sources:
              s: {{type: generate, rows: 2}}
            transforms:
              enrich: {{type: handler, from: s, url: "{endpoint.url}{path}", schema_override: {override}}}
            sinks:
              out: {{type: blackhole, from: enrich}}
        """)
    assert info.value.headline().startswith("handler transform 'enrich': ")
    assert expected in info.value.headline()
