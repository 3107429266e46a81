"""Widget requests on the kernel's control channel (``streamling.notebook.control``): a request names
its widget by token, is handed to that widget in a thread of its own (the control thread stays free
for interrupts) and is answered at once; an unknown token is answered as such, so the front end
falls back to the comm."""

from __future__ import annotations

import gc
import threading
from typing import Any

from streamling.notebook import control


class _Session:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, _stream: Any, msg_type: str, content: dict[str, Any], _parent: Any, _ident: Any) -> None:
        self.sent.append((msg_type, content))


class _Kernel:
    def __init__(self) -> None:
        self.session = _Session()


def test_a_request_reaches_its_widget_in_a_thread_of_its_own_and_is_answered_at_once() -> None:
    got: list[tuple[dict[str, Any], str]] = []
    done = threading.Event()

    def handler(request: dict[str, Any]) -> None:
        got.append((request, threading.current_thread().name))
        done.set()

    token, keep = control.register(handler)
    kernel = _Kernel()
    control._on_request(kernel, None, [b"id"], {"content": {"token": token, "request": {"action": "stop"}}})
    assert kernel.session.sent == [(control.REPLY, {"status": "ok"})]
    assert done.wait(5)
    assert got == [({"action": "stop"}, "streamling-widget-request")]
    del keep


def test_an_unknown_or_closed_widget_is_answered_as_such() -> None:
    kernel = _Kernel()
    control._on_request(kernel, None, [], {"content": {"token": "nope", "request": {"action": "stop"}}})
    control._on_request(kernel, None, [], {"content": {"token": 42}})
    token, keep = control.register(lambda _request: None)
    del keep
    gc.collect()  # the widget holding the receiver is gone
    control._on_request(kernel, None, [], {"content": {"token": token, "request": {"type": "ping"}}})
    assert [content["status"] for _, content in kernel.session.sent] == ["error", "error", "error"]


def test_installing_outside_a_kernel_does_nothing() -> None:
    assert control.install() is False
