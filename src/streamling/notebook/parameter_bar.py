"""The notebook's ``dbutils.widgets`` as input controls, all of them in one widget.

Databricks draws a notebook's widgets in a bar above its cells, whatever cell declared them. One
``ParameterBar`` per kernel holds every declared widget; each declaration shows it again in the
declaring cell. Where the front end offers a bar above the cells (JupyterLab with streamling's
extension, ``widgets/labextension``), the latest view draws the controls there and leaves a one-line
note in its cell; elsewhere (Notebook without the extension, VS Code) each view draws them in its
cell. A value changed in any view is what ``dbutils.widgets.get`` and ``{{name}}`` read from then
on, in every view.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import traitlets

from streamling.notebook.widget import SummarizedWidget, front_end

if TYPE_CHECKING:
    from streamling.notebook.dbutils import Widgets


class ParameterBar(SummarizedWidget):
    """The input controls of a kernel's declared widgets (``controls``) and what they hold (``values``:
    name → text; a multiselect's choices joined by commas, as ``get`` returns them)."""

    _esm = front_end("parameters.js")
    _css = front_end("parameters.css")
    controls = traitlets.List(traitlets.Dict()).tag(sync=True)
    values = traitlets.Dict().tag(sync=True)

    def __init__(self, widgets: Widgets) -> None:
        super().__init__()
        self._widgets = widgets
        self.observe(self._changed_in_page, names="values")
        self.refresh()

    def refresh(self) -> None:
        """Show the widgets as declared now (a declaration, ``remove`` or ``removeAll`` changed them)."""
        declared = self._widgets.declared()
        with self.hold_sync():
            self.controls = [{"name": name, "kind": w.kind, "label": w.label or name, "choices": list(w.choices)}
                             for name, w in declared.items()]
            self.values = self._widgets.values()

    def _changed_in_page(self, change: dict[str, Any]) -> None:
        declared = self._widgets.declared()
        for name, value in (change["new"] or {}).items():
            widget = declared.get(name)
            if widget is not None and isinstance(value, str):
                widget.value = value

    def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
        """The bar sends no requests: its values reach the kernel as a synced trait."""

    def summary_text(self) -> str:
        values = self._widgets.values()
        return "parameters: " + (", ".join(f"{n} = {v}" for n, v in values.items()) or "none")

    def summary_html(self) -> str:
        return f"<code>{html.escape(self.summary_text())}</code>"

    def _push(self) -> None:  # every change is made (and sent) by the kernel's own thread
        self._dirty = False
