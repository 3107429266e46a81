"""HTTP nodes without Spark: secrets, header clashes, limits and the request bodies they build."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streamling.config import Settings, load_settings
from streamling.errors import StreamlingError
from streamling.http.client import HttpCall, build_call, encode_requests, redact_url
from streamling.runtime.nodes import NodeContext
from streamling.spec import parse_pipeline
from streamling.spec.options import HttpNodeOptions

SECRET_ENV = {"STREAMLING__HTTP_SECRET_HEADER__Partner_Api": "X-Api-Key",
              "STREAMLING__HTTP_SECRET_VALUE__Partner_Api": "k-123"}


def _call(node_yaml: str, settings: Settings) -> HttpCall:
    spec = parse_pipeline(f"""
sources:
  s: {{type: generate, rows: 1}}
transforms:
  h: {node_yaml}
sinks:
  out: {{type: blackhole, from: h}}
""")
    node = spec.nodes["h"]
    assert isinstance(node.options, HttpNodeOptions)
    return build_call(NodeContext(spec=node, settings=settings), node.options, "handler transform")


def test_defaults_and_secret_from_the_environment(tmp_path: Path) -> None:
    settings = load_settings(environ=SECRET_ENV, cwd=tmp_path)
    limits = settings.external_http_handler
    assert (limits.trigger_max_count, limits.operator_timeout_sec, limits.buffer_size) == (2000, 300, 25)
    assert settings.http_secret("PARTNER_API") == ("X-Api-Key", "k-123")  # env names arrive lower-cased
    assert settings.masked()["http_secret_value"] == {"partner_api": "***"}
    call = _call('{type: handler, from: s, url: "http://x/y", secret_name: partner_api, headers: {X-Other: 1}}',
                 settings)
    assert dict(call.headers) == {"X-Other": "1", "X-Api-Key": "k-123", "Content-Type": "application/json"}
    assert call.redact("echo k-123!") == "echo ***!"
    assert (call.rows_per_request, call.concurrency, call.timeout_secs) == (2000, 25, 300)


def test_a_secret_and_an_explicit_header_of_one_name_is_an_error(tmp_path: Path) -> None:
    settings = load_settings(environ=SECRET_ENV, cwd=tmp_path)
    with pytest.raises(StreamlingError) as info:
        _call('{type: handler, from: s, url: "http://x/y", secret_name: partner_api, headers: {x-api-key: mine}}',
              settings)
    assert info.value.headline() == ("handler transform 'h': header 'x-api-key' is set both in 'headers' and by "
                                     "secret 'partner_api' — keep only one of them")
    assert "k-123" not in str(info.value) and "mine" not in str(info.value)


def test_a_missing_secret_names_the_variables_to_set(tmp_path: Path) -> None:
    settings = load_settings(environ={"STREAMLING__HTTP_SECRET_HEADER__HOOK": "Authorization"}, cwd=tmp_path)
    with pytest.raises(StreamlingError) as info:
        _call('{type: handler, from: s, url: "http://x/y", secret_name: hook}', settings)
    assert info.value.headline() == ("handler transform 'h': HTTP secret 'hook' is not configured — set "
                                     "STREAMLING__HTTP_SECRET_VALUE__HOOK")


def test_batch_size_is_capped_by_trigger_max_count_and_bodies_follow_the_payload_version(tmp_path: Path) -> None:
    settings = load_settings(environ={}, cwd=tmp_path, overrides={"external_http_handler": {"trigger_max_count": 3}})
    call = _call('{type: handler, from: s, url: "http://x/y", batch_size: 10}', settings)
    rows: list[dict[str, Any]] = [{"id": i, "_gs_op": "u"} for i in range(5)]
    bodies = [json.loads(body) for _, body in encode_requests(rows, call)]
    assert bodies == [rows[:3], rows[3:]]  # v0: flat objects with _gs_op, arrays in batch mode
    one = _call('{type: handler, from: s, url: "http://x/y", one_row_per_request: true, payload_version: 1}', settings)
    bodies = [json.loads(body) for _, body in encode_requests(rows[:2], one)]
    assert bodies == [{"metadata": {"op": "u"}, "data": {"id": 0, "_gs_op": "u"}},
                      {"metadata": {"op": "u"}, "data": {"id": 1, "_gs_op": "u"}}]


def test_urls_lose_their_credentials_in_messages() -> None:
    assert redact_url("https://user:pw@api.example.com:8443/hook?x=1") == "https://api.example.com:8443/hook?x=1"
    assert redact_url("http://127.0.0.1:9/x") == "http://127.0.0.1:9/x"
    # a query (where a pasted webhook URL carries its token) only when asked: HTTP nodes show theirs
    assert redact_url("https://user:pw@hooks.example.com/T1?token=abc", hide_query=True) == "https://hooks.example.com/T1?…"
    assert redact_url("http://127.0.0.1:9/x", hide_query=True) == "http://127.0.0.1:9/x"


def test_options_reject_bad_urls_types_and_unknown_keys() -> None:
    with pytest.raises(StreamlingError) as info:
        parse_pipeline("""
sources:
  s: {type: generate, rows: 1}
transforms:
  h: {type: handler, from: s, url: "ftp://x", schema_override: {a: int128}, retries: 3}
sinks:
  out: {type: webhook, from: h, url: "http://x", skip_on_eror: true}
""")
    text = str(info.value)
    assert "ftp://x" in text and "int128" in text and "retries" in text and "skip_on_eror" in text


def test_refused_connections_are_retried_then_reported_with_the_url(tmp_path: Path) -> None:
    import socket

    from streamling.errors import NodeFailure, node_failure_from_text
    from streamling.http.client import HttpSender

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    settings = load_settings(environ={}, cwd=tmp_path, overrides={
        "retry": {"max_attempts": 3, "initial_backoff_ms": 1, "max_backoff_ms": 2}})
    call = _call(f'{{type: handler, from: s, url: "http://u:pw@127.0.0.1:{port}/x"}}', settings)
    sender = HttpSender(call)
    try:
        with pytest.raises(NodeFailure) as info:
            sender.send_all([b"{}"])
    finally:
        sender.close()
    error = node_failure_from_text(str(info.value))
    assert error is not None
    assert error.headline().startswith(f"handler transform 'h': POST http://127.0.0.1:{port}/x failed with "
                                       "connection failure after 3 attempts: ConnectError")


def test_credentials_in_the_url_and_headers_are_masked_however_encoded(tmp_path: Path) -> None:
    import base64

    settings = load_settings(environ={}, cwd=tmp_path)
    call = _call('{type: handler, from: s, url: "http://svc:p%40ss-w0rd@x/y", '
                 'headers: {Authorization: "Bearer tok-123456", X-Trace: visible}}', settings)
    basic = base64.b64encode(b"svc:p@ss-w0rd").decode()
    echo = (f"auth was Basic {basic}, pw p@ss-w0rd (p%40ss-w0rd), bearer tok-123456 "
            f"({base64.b64encode(b'tok-123456').decode()}), trace visible")
    assert call.redact(echo) == "auth was Basic ***, pw *** (***), bearer *** (***), trace visible"
    assert call.safe_url == "http://x/y"
