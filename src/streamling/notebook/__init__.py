"""Notebook authoring: ``%load_ext streamling`` registers the ``%%streamling`` magics."""

from __future__ import annotations

from typing import Any


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics, the ``PipelineError`` display and (unless the kernel has them) ``dbutils``
    and a ``display`` that shows Spark DataFrames as Databricks' does.

    ``set_custom_exc`` holds one handler per shell: loading streamling replaces another extension's.
    """
    from streamling.cli import quiet_spark_python_logs
    from streamling.notebook.cells import PipelineError
    from streamling.notebook.dbutils import dbutils
    from streamling.notebook.magics import StreamlingMagics, show_pipeline_error

    ipython.register_magics(StreamlingMagics)
    ipython.set_custom_exc((PipelineError,), show_pipeline_error)
    magics = ipython.magics_manager.registry.get("StreamlingMagics")
    # py4j's and PySpark's own reports of a failure (a Python traceback, a JSON line holding the
    # Java plan) would reach the cell before our one-line error: silenced as the CLI does, and
    # shown again while StreamlingMagics.full_traceback is on (see its observer).
    quiet_spark_python_logs(debug=bool(getattr(magics, "full_traceback", False)))
    if "dbutils" not in ipython.user_ns:  # on Databricks the real dbutils wins
        ipython.user_ns["dbutils"] = dbutils
    if "display" not in ipython.user_ns:  # IPython's is a builtin; Databricks' own wins
        from streamling.notebook.display import display

        ipython.user_ns["display"] = display
