"""What the notebook's widgets share: their front-end files, and the text/HTML a renderer without
widgets (nbval, nbconvert, jobs) shows instead."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import anywidget

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


class SummarizedWidget(anywidget.AnyWidget):  # type: ignore[misc]
    """A widget whose output also carries ``summary_text``/``summary_html`` for renderers without one."""

    def summary_text(self) -> str:
        raise NotImplementedError

    def summary_html(self) -> str:
        raise NotImplementedError

    def _repr_mimebundle_(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        bundle = super()._repr_mimebundle_(**kwargs)
        data, metadata = bundle if bundle is not None else ({}, {})
        data = dict(data)
        data["text/plain"] = self.summary_text()
        data["text/html"] = self.summary_html()
        return data, metadata
