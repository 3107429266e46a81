"""What the notebook's widgets share: their front-end files, the text/HTML a renderer without
widgets (nbval, nbconvert, jobs) shows instead, and throttled pushes of their state."""

from __future__ import annotations

import threading
import time
from abc import ABCMeta, abstractmethod
from importlib import resources
from pathlib import Path
from typing import Any

import anywidget
import traitlets

#: Prepended to every widget's ESM / CSS: an anywidget module is a single file.
COMMON_JS, COMMON_CSS = "common.js", "common.css"


def asset(name: str) -> Path:
    """A front-end file: packaged as ``streamling.widgets`` in a wheel, or the repository's
    top-level ``widgets/`` folder in an editable install (which does not map that package)."""
    try:
        packaged = resources.files("streamling.widgets").joinpath(name)
        if packaged.is_file():
            return Path(str(packaged))
    except (ModuleNotFoundError, TypeError):
        pass
    return Path(__file__).resolve().parents[3] / "widgets" / name


def front_end(name: str) -> str:
    """The text of a widget's ``.js`` or ``.css`` file with the shared one before it."""
    common = COMMON_JS if name.endswith(".js") else COMMON_CSS
    return asset(common).read_text(encoding="utf-8") + "\n" + asset(name).read_text(encoding="utf-8")


PUSH_INTERVAL_SECS = 0.25  # at most ~4 trait pushes per second
#: how often a widget of a live run tells its front end that its kernel is there
BEAT_SECS = 1.0


class _WidgetMeta(type(anywidget.AnyWidget), ABCMeta):  # type: ignore[misc]
    """traitlets' metaclass with ``abc``'s, so a widget missing a summary cannot be created."""


class SummarizedWidget(anywidget.AnyWidget, metaclass=_WidgetMeta):  # type: ignore[misc]
    """A widget fed from background threads: state changes under ``_lock`` mark it dirty and
    ``_schedule`` pushes the traits at most every ``PUSH_INTERVAL_SECS`` (a trailing timer always
    sends the last state). Its output also carries ``summary_text``/``summary_html`` for renderers
    without widgets."""

    #: True: a change not marked immediate is always pushed from the timer thread, so the thread that
    #: made it (an epoch publishing an event) never pays for the push
    push_from_timer = False
    #: bumped every ``BEAT_SECS`` while a run feeds the widget. A front end learns from it that a
    #: kernel is behind the widget even while that kernel is busy (Run All, ``%streamling wait``) and
    #: cannot answer its ping; a notebook reopened from saved widget state gets neither.
    beat = traitlets.Int(0).tag(sync=True)
    #: names this widget in requests its front end sends on the kernel's control channel, which the
    #: kernel reads even while a cell runs (``streamling.notebook.control``)
    control_token = traitlets.Unicode("").tag(sync=True)

    def __init__(self, **kwargs: Any) -> None:
        from streamling.notebook import control

        super().__init__(**kwargs)
        self.control_token = control.register(self)
        self.on_msg(self._on_message)
        self._lock = threading.RLock()
        self._dirty = False
        self._last_push = 0.0
        self._timer: threading.Timer | None = None
        self._beating: threading.Event | None = None

    def keep_beating(self, beating: bool) -> None:
        """Start (or stop) the heartbeat: on while a run is starting, running or stopping."""
        with self._lock:
            if beating and self._beating is None:
                self._beating = threading.Event()
                threading.Thread(target=self._beat, args=(self._beating,), name="streamling-widget-beat",
                                 daemon=True).start()
            elif not beating and self._beating is not None:
                self._beating.set()
                self._beating = None

    def _beat(self, stop: threading.Event) -> None:
        while not stop.wait(BEAT_SECS):
            try:
                self.beat = self.beat + 1
            except Exception:  # noqa: BLE001 - a closed comm: nothing listens any more
                return

    def handle_request(self, request: dict[str, Any]) -> None:
        """A request sent on the kernel's control channel (``streamling.notebook.control``), in a
        thread of its own while a cell may be running: handled as the same comm message."""
        self._on_message(self, request, [])

    @abstractmethod
    def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        """A request from the front end: a comm message, or the same content sent on the kernel's
        control channel (then in a thread of its own, while a cell may be running)."""

    @abstractmethod
    def summary_text(self) -> str:
        """A plain-text picture of the widget's state."""

    @abstractmethod
    def summary_html(self) -> str:
        """The same as a small HTML fragment."""

    @abstractmethod
    def _push(self) -> None:
        """Send the state to the front end (the caller holds ``_lock``); clears ``_dirty``."""

    def _schedule(self, immediate: bool) -> None:
        with self._lock:
            if not self._dirty:
                return
            wait = self._last_push + PUSH_INTERVAL_SECS - time.monotonic()
            if immediate or (wait <= 0 and not self.push_from_timer):
                if self._timer is not None:
                    self._timer.cancel()
                    self._timer = None
                self._push()
            elif self._timer is None:
                self._timer = threading.Timer(max(0.0, wait), self._on_timer)
                self._timer.daemon = True
                self._timer.start()

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            if self._dirty:
                self._push()

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        bundle = super()._repr_mimebundle_(**kwargs)
        data, metadata = bundle if bundle is not None else ({}, {})
        data = dict(data)
        data["text/plain"] = self.summary_text()
        data["text/html"] = self.summary_html()
        return data, metadata
