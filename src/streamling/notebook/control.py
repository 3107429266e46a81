"""Widget requests on the kernel's control channel: handled beside a busy cell.

A widget's message to its kernel (a button, a ping, a download) travels as a comm message on the
shell channel, which the kernel reads only between cells: during Run All or ``%streamling wait`` a
click on Stop waited for the busy cell. ipykernel reads its control channel in a thread of its own
(interrupts and debug requests come that way), so streamling's widgets send their requests there
(``streamling_control_request``, naming the widget by its ``control_token``) where the front end
allows it (JupyterLab's kernel connection) and the kernel has the handler (a widget gets no token
otherwise: a request the kernel does not know would get no answer), and fall back to the comm
elsewhere. The request is
handed to a thread of its own and answered at once: the control thread stays free for interrupts.
A widget answers as it always does, on its comm (IOPub is read while the kernel is busy).
"""

from __future__ import annotations

import logging
import threading
import uuid
import weakref
from collections.abc import Callable
from typing import Any, Protocol

log = logging.getLogger(__name__)

#: the control message streamling's widgets send, and its reply
REQUEST, REPLY = "streamling_control_request", "streamling_control_reply"


class Receiver(Protocol):
    """What takes a widget's requests (``SummarizedWidget``)."""

    def handle_request(self, request: dict[str, Any]) -> None: ...


#: token → the widget it names; held weakly, so a widget nothing else holds leaves by itself
_receivers: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_lock = threading.Lock()


def register(receiver: Receiver) -> str:
    """A token naming ``receiver`` in control requests, or ``""`` where this process's kernel has no
    control handler for them (outside a kernel, a kernel without control handlers): the front end
    then sends every request as a comm message, which is always answered."""
    if not install():
        return ""
    token = uuid.uuid4().hex
    with _lock:
        _receivers[token] = receiver
    return token


def install() -> bool:
    """Add the ``streamling_control_request`` handler to the running ipykernel (once); False outside
    a kernel or where the kernel has no control handlers."""
    try:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
    except ImportError:
        return False
    handlers = getattr(kernel, "control_handlers", None)
    if not isinstance(handlers, dict):
        return False
    handlers.setdefault(REQUEST, lambda stream, ident, parent: _on_request(kernel, stream, ident, parent))
    return True


def deliver(token: str, content: dict[str, Any]) -> bool:
    """Hand ``content`` to the widget holding ``token`` in a thread of its own; False when no widget
    of this process holds it (closed, or from another kernel)."""
    with _lock:
        receiver = _receivers.get(token)
    if receiver is None:
        return False
    threading.Thread(target=_run, args=(receiver.handle_request, content), name="streamling-widget-request",
                     daemon=True).start()
    return True


def _run(handler: Callable[[dict[str, Any]], None], content: dict[str, Any]) -> None:
    try:
        handler(content)
    except Exception:  # noqa: BLE001 - a widget request has no cell to fail; its widget reports its own errors
        log.debug("widget request %r failed", content, exc_info=True)


def _on_request(kernel: Any, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
    """The kernel's control handler (its control thread): deliver, and reply at once."""
    content = parent.get("content") or {}
    token = content.get("token") if isinstance(content, dict) else None
    request = content.get("request") if isinstance(content, dict) else None
    delivered = isinstance(token, str) and isinstance(request, dict) and deliver(token, request)
    kernel.session.send(stream, REPLY, {"status": "ok" if delivered else "error",
                                        **({} if delivered else {"ename": "UnknownWidget"})}, parent, ident)
