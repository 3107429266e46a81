"""Calling HTTP endpoints from pipelines: the ``handler`` transform and the ``webhook`` sink share this."""

from streamling.http.client import HttpCall, HttpSender, build_call, encode_requests, redact_url

__all__ = ["HttpCall", "HttpSender", "build_call", "encode_requests", "redact_url"]
