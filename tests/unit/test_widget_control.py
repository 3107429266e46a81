"""Widget requests on the kernel's control channel (``streamling.notebook.control``): a request names
its widget by token, is handed to that widget in a thread of its own (the control thread stays free
for interrupts) and is answered at once; an unknown token is answered as such, so the front end
falls back to the comm; where the kernel has no handler, a widget gets no token at all."""

from __future__ import annotations

import gc
import threading
from typing import Any

import pytest

from streamling.notebook import control


class _Session:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, _stream: Any, msg_type: str, content: dict[str, Any], _parent: Any, _ident: Any) -> None:
        self.sent.append((msg_type, content))


class _Kernel:
    def __init__(self) -> None:
        self.session = _Session()


class _Widget:
    def __init__(self) -> None:
        self.got: list[tuple[dict[str, Any], str]] = []
        self.done = threading.Event()

    def handle_request(self, request: dict[str, Any]) -> None:
        self.got.append((request, threading.current_thread().name))
        self.done.set()


@pytest.fixture
def in_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(control, "install", lambda: True)


def test_a_request_reaches_its_widget_in_a_thread_of_its_own_and_is_answered_at_once(in_kernel: None) -> None:
    widget = _Widget()
    token = control.register(widget)
    kernel = _Kernel()
    control._on_request(kernel, None, [b"id"], {"content": {"token": token, "request": {"action": "stop"}}})
    assert kernel.session.sent == [(control.REPLY, {"status": "ok"})]
    assert widget.done.wait(5)
    assert widget.got == [({"action": "stop"}, "streamling-widget-request")]


def test_an_unknown_or_closed_widget_is_answered_as_such(in_kernel: None) -> None:
    kernel = _Kernel()
    control._on_request(kernel, None, [], {"content": {"token": "nope", "request": {"action": "stop"}}})
    control._on_request(kernel, None, [], {"content": {"token": 42}})
    widget = _Widget()
    token = control.register(widget)
    del widget
    gc.collect()  # the widget is gone
    control._on_request(kernel, None, [], {"content": {"token": token, "request": {"type": "ping"}}})
    assert [content["status"] for _, content in kernel.session.sent] == ["error", "error", "error"]


def test_outside_a_kernel_a_widget_gets_no_token_and_its_front_end_uses_the_comm() -> None:
    assert control.install() is False
    assert control.register(_Widget()) == ""
