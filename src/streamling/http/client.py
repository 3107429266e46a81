"""Request building, secrets, bounded concurrency and retries for HTTP nodes.

The ``handler`` transform sends from Spark's Python workers and the ``webhook`` sink from the
driver, so everything a sender needs travels in ``HttpCall``: plain, picklable data resolved once
on the driver (headers with the secret already looked up). Secret values are kept only in the
headers sent; every message and log line uses ``redact`` and ``safe_url`` so they never leak.
Failures are raised as ``NodeFailure`` so that, from either side, the user sees
"<type> <kind> '<name>': …" with the URL and the HTTP status.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import random
import re
import socket
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

from streamling.errors import NodeFailure, StreamlingError
from streamling.runtime.nodes import GS_OP, NodeContext
from streamling.runtime.retry import backoff_wait
from streamling.spec.options import HttpNodeOptions

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

#: statuses worth another attempt: the server is overloaded or restarting, not refusing the request.
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504}) | frozenset(range(505, 600))
SNIPPET_CHARS = 200


def redact_url(url: str, hide_query: bool = False) -> str:
    """The URL without ``user:password@`` (credentials there must not reach logs or errors); with
    ``hide_query`` its query shows as ``…`` too (where tokens go in URLs a user only pastes in, such
    as a webhook's)."""
    parts = urlsplit(url)
    query = "…" if hide_query and parts.query else parts.query
    if parts.username is None and parts.password is None and query == parts.query:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


_CREDENTIAL_HEADER = re.compile(r"authorization|cookie|api[-_]?key|token|secret|passw", re.I)


def credential_forms(url: str, headers: dict[str, str], query: bool = False) -> list[str]:
    """Every way a credential of this call may come back in text: the URL's ``user:password`` (which
    the HTTP client sends as ``Authorization: Basic …``) and credential-bearing header values, each
    raw, Base64-encoded and percent-encoded, so an endpoint echoing them cannot leak them into logs.
    With ``query``, the query's values too (for URLs whose query is hidden, see ``redact_url``)."""
    raw: list[str] = []
    parts = urlsplit(url)
    if parts.password:
        user, password = unquote(parts.username or ""), unquote(parts.password)
        raw += [f"{user}:{password}", password]
    if query:
        raw += [value for _, value in parse_qsl(parts.query)]
    for name, value in headers.items():
        if _CREDENTIAL_HEADER.search(name) and value:
            raw.append(value)
            scheme, _, token = value.partition(" ")
            if token and scheme.lower() in {"basic", "bearer", "token"}:
                raw.append(token)
                if scheme.lower() == "basic":
                    try:
                        raw.append(base64.b64decode(token, validate=True).decode())
                    except (ValueError, UnicodeDecodeError):
                        pass
    forms: list[str] = []
    for value in raw:
        if len(value) < 4:  # too short to mask without masking ordinary text
            continue
        forms += [value, base64.b64encode(value.encode()).decode(), quote(value, safe="")]
    return forms


def _longest_first(values: list[str]) -> tuple[str, ...]:
    """Distinct values, longest first: masking a short one inside a longer one would leave the rest visible."""
    return tuple(sorted(dict.fromkeys(values), key=len, reverse=True))


@dataclass(frozen=True)
class Delivery:
    """How one ``post_notification`` went, in words fit for a log line or a stored record."""

    url: str  # without userinfo, its query shown as "…"
    sent: bool
    detail: str  # "HTTP <status>", or the failure's text with the URL's credentials masked


def post_notification(url: str, payload: Mapping[str, Any], timeout_secs: float = 10.0) -> Delivery:
    """POST ``payload`` as JSON to ``url`` once, best effort (a job's webhook notification).

    Such a URL is pasted in by a user and may carry credentials (``user:password@``, a token in the
    query), so the answer never holds them: the URL is redacted with its query hidden, and an
    error's text is masked for every form of them it may echo, so callers log and store it as is.
    """
    import httpx

    safe = redact_url(url, hide_query=True)
    try:
        response = httpx.post(url, json=payload, timeout=timeout_secs)
    except httpx.HTTPError as exc:
        detail = str(exc).replace(url, safe)
        for secret in _longest_first(credential_forms(url, {}, query=True)):
            detail = detail.replace(secret, "***")
        return Delivery(safe, False, detail)
    return Delivery(safe, response.status_code < 400, f"HTTP {response.status_code}")


@dataclass(frozen=True)
class HttpCall:
    """What a sender needs, resolved on the driver. Plain data so it pickles into Python workers."""

    node: str
    node_kind: str  # "handler transform" / "webhook sink": the prefix of every error
    url: str
    headers: tuple[tuple[str, str], ...]
    secret_values: tuple[str, ...]
    one_row_per_request: bool
    payload_version: int
    rows_per_request: int
    concurrency: int
    timeout_secs: float
    max_attempts: int
    initial_backoff_ms: int
    max_backoff_ms: int
    skip_on_error: bool = False

    @property
    def safe_url(self) -> str:
        return redact_url(self.url)

    def redact(self, text: str) -> str:
        """``text`` with every secret value masked (an endpoint may echo headers in its errors)."""
        for secret in self.secret_values:
            if secret:
                text = text.replace(secret, "***")
        return text

    def failure(self, message: str, hint: str | None = None) -> NodeFailure:
        # NodeFailure travels as "marker[…]" inside a JVM error: brackets would cut it short.
        clean = self.redact(message).replace("[", "(").replace("]", ")")
        return NodeFailure(self.node, self.node_kind, clean, hint)


def build_call(ctx: NodeContext, options: HttpNodeOptions, node_kind: str, skip_on_error: bool = False) -> HttpCall:
    """Resolve headers, the secret and the limits for one node; config problems name the node.

    A header given both explicitly and by ``secret_name`` is ambiguous (which one is sent?), so
    it is an error rather than a silent override, as in Streamling.
    """
    settings = ctx.settings
    headers = dict(options.headers or {})
    secrets: list[str] = []
    if options.secret_name:
        try:
            name, value = settings.http_secret(options.secret_name)
        except StreamlingError as exc:
            raise ctx.error(exc.message, code="config_invalid", hint=exc.hint) from None
        clash = [k for k in headers if k.lower() == name.lower()]
        if clash:
            raise ctx.error(f"header '{clash[0]}' is set both in 'headers' and by secret '{options.secret_name}'",
                            code="config_invalid", hint="keep only one of them")
        headers[name] = value
        secrets.append(value)
    if not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"
    secrets += credential_forms(options.url, headers)
    limits = settings.external_http_handler
    rows_per_request = 1 if options.one_row_per_request else min(options.batch_size or limits.trigger_max_count,
                                                                  limits.trigger_max_count)
    return HttpCall(node=ctx.name, node_kind=node_kind, url=options.url, headers=tuple(headers.items()),
                    secret_values=_longest_first(secrets), one_row_per_request=options.one_row_per_request,
                    payload_version=options.payload_version, rows_per_request=rows_per_request,
                    concurrency=limits.buffer_size, timeout_secs=limits.operator_timeout_sec,
                    max_attempts=settings.retry.max_attempts, initial_backoff_ms=settings.retry.initial_backoff_ms,
                    max_backoff_ms=settings.retry.max_backoff_ms, skip_on_error=skip_on_error)


# --- payloads ------------------------------------------------------------------------------------

def _json_default(value: Any) -> Any:
    """JSON for what Arrow hands back: ISO-8601 times, exact decimals as text, bytes as base64."""
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    return str(value)


def row_payload(row: dict[str, Any], version: int) -> dict[str, Any]:
    """v0: the row as a flat object (``_gs_op`` included); v1: ``{"metadata":{"op"},"data"}``."""
    if version == 0:
        return row
    return {"metadata": {"op": row.get(GS_OP) or "i"}, "data": dict(row)}  # Streamling keeps _gs_op in data


def encode_requests(rows: list[dict[str, Any]], call: HttpCall) -> list[tuple[list[dict[str, Any]], bytes]]:
    """Group rows into requests: one object per request, or JSON arrays of ``rows_per_request``."""
    out: list[tuple[list[dict[str, Any]], bytes]] = []
    step = call.rows_per_request
    for start in range(0, len(rows), step):
        group = rows[start:start + step]
        payloads = [row_payload(r, call.payload_version) for r in group]
        body: Any = payloads[0] if call.one_row_per_request else payloads
        out.append((group, json.dumps(body, default=_json_default, separators=(",", ":")).encode()))
    return out


def response_rows(call: HttpCall, response: httpx.Response, sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Output rows from one response: an object (or array of objects), in v0 or v1 shape.

    ``_gs_op`` comes from the response when it has one; otherwise it is carried from the rows sent
    when the counts match (an enricher answering row for row), else it is an insert.
    """
    try:
        data = response.json()
    except ValueError:
        body = _snippet(call.redact(response.text))
        raise call.failure(f"POST {call.safe_url} answered HTTP {response.status_code} with a body that is not JSON: "
                           f"{body}", hint="the endpoint must answer with JSON") from None
    if data is None:
        return []
    items = data if isinstance(data, list) else [data]
    rows: list[dict[str, Any]] = []
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            raise call.failure(f"POST {call.safe_url} answered with {type(item).__name__} {_snippet(json.dumps(item))} "
                               "where a JSON object was expected",
                               hint="answer with one object per row (an array of them in batch mode)")
        op: Any = None
        if call.payload_version == 1 and isinstance(item.get("data"), dict):
            row = dict(item["data"])
            metadata = item.get("metadata")
            op = metadata.get("op") if isinstance(metadata, dict) else None
        else:
            row = dict(item)
            op = row.get(GS_OP)
        if op is None:
            op = (sent[index].get(GS_OP) if len(items) == len(sent) else None) or "i"
        row[GS_OP] = op
        rows.append(row)
    return rows


def _snippet(text: str) -> str:
    """At most ``SNIPPET_CHARS`` of a body, whitespace folded; redact before, never after, cutting."""
    text = " ".join(text.split())
    return text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS] + "…"


# --- sending -------------------------------------------------------------------------------------

class HttpSender:
    """POSTs bodies with at most ``call.concurrency`` in flight, returning responses in order.

    Transient failures (connection errors, timeouts, HTTP 5xx and 429) are retried here, per
    request, with exponential backoff and jitter (``Retry-After`` is honoured up to the backoff
    cap); other 4xx fail at once. Why not leave it to the flow: re-running the epoch would POST
    every request of it again, and the handler sends from Spark workers. The failure raised after
    the last attempt is not retriable, so the flow never multiplies these attempts, and a stop
    request interrupts the waits (``backoff_wait``). With ``skip_on_error`` (webhook) a 5xx is
    logged and skipped instead.
    """

    def __init__(self, call: HttpCall) -> None:
        import httpx

        self.call = call
        self.headers = dict(call.headers)
        limits = httpx.Limits(max_connections=call.concurrency, max_keepalive_connections=call.concurrency)
        # Small JSON requests: without TCP_NODELAY, Nagle's algorithm and delayed ACKs add ~40 ms
        # to requests whose headers and body leave in separate writes.
        transport = httpx.HTTPTransport(limits=limits,
                                        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        self.client = httpx.Client(
            timeout=httpx.Timeout(call.timeout_secs, connect=min(call.timeout_secs, 30.0)), transport=transport)
        self.pool = ThreadPoolExecutor(max_workers=call.concurrency, thread_name_prefix=f"http-{call.node}")
        self._lock = threading.Lock()
        self.skipped = 0

    def send_all(self, bodies: Sequence[bytes]) -> list[httpx.Response | None]:
        """Responses in the order of ``bodies`` (``None`` for a skipped request)."""
        if len(bodies) == 1:
            return [self.send(bodies[0])]
        return list(self.pool.map(self.send, bodies))

    def send(self, body: bytes) -> httpx.Response | None:
        import httpx

        call = self.call
        delay = call.initial_backoff_ms / 1000
        for attempt in range(1, call.max_attempts + 1):
            wait: float | None = None
            try:
                response = self.client.post(call.url, content=body, headers=self.headers)
            except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                # Refused/reset connections, timeouts and servers hanging up are transient; a bad
                # URL scheme or proxy setting (other TransportErrors) would fail the same way again.
                problem = f"{type(exc).__name__}: {exc}".rstrip(": ")
                status = None
            except httpx.TransportError as exc:
                raise call.failure(f"POST {call.safe_url} cannot be sent: {type(exc).__name__}: {exc}",
                                   hint="check the url and proxy settings") from None
            else:
                status = response.status_code
                if status < 400:
                    return response
                problem = f"HTTP {status}: {_snippet(call.redact(response.text))}"
                if status >= 500 and call.skip_on_error:
                    with self._lock:
                        self.skipped += 1
                    log.warning("%s '%s': POST %s answered %s; skipped (skip_on_error)", call.node_kind, call.node,
                                call.safe_url, call.redact(problem))
                    return None
                if status not in TRANSIENT_STATUSES:
                    raise call.failure(f"POST {call.safe_url} was rejected with {problem}",
                                       hint="fix the request or the endpoint; HTTP 4xx other than 429 is not retried")
                wait = _retry_after(response.headers.get("Retry-After"))
            if attempt >= call.max_attempts:
                what = f"HTTP {status}" if status is not None else "connection failure"
                raise call.failure(f"POST {call.safe_url} failed with {what} after {attempt} attempt"
                                   f"{'s' if attempt != 1 else ''}: {problem}",
                                   hint="check that the endpoint is up; retries follow retry.max_attempts")
            sleep = wait if wait is not None else delay * (0.8 + 0.4 * random.random())
            sleep = min(sleep, call.max_backoff_ms / 1000)
            log.warning("%s '%s': POST %s failed (attempt %d/%d), retrying in %.2fs: %s", call.node_kind, call.node,
                        call.safe_url, attempt, call.max_attempts, sleep, call.redact(problem))
            # A stop request (SIGTERM) cuts the wait short on the driver (webhook); the epoch is replayed.
            backoff_wait(sleep, f"POST {call.safe_url}", call.node, call.node_kind)
            delay = min(delay * 2, call.max_backoff_ms / 1000)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.client.close()


def _retry_after(value: str | None) -> float | None:
    if value and re.fullmatch(r"\s*\d+(\.\d+)?\s*", value):
        return float(value)
    return None


def rounds(batches: Iterable[Any], rows_per_round: int) -> Iterator[list[dict[str, Any]]]:
    """Rows of Arrow batches regrouped so each round fills every concurrent request slot.

    Spark hands over batches of ``arrow.maxRecordsPerBatch`` rows; sending per batch would leave
    slots idle in batch mode. Order is kept: rounds follow one another and rows keep their places.
    """
    pending: list[dict[str, Any]] = []
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.extend(batch.to_pylist())
        if len(pending) >= rows_per_round:
            yield pending
            pending = []
    if pending:
        yield pending
