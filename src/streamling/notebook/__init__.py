"""Notebook authoring: ``%load_ext streamling`` registers the ``%%streamling`` magics."""

from __future__ import annotations

import logging
import sys
from typing import Any


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (a notebook in JupyterLab, nbclient, papermill)."""
    from IPython import get_ipython

    return type(get_ipython()).__name__ == "ZMQInteractiveShell"


class NotesHandler(logging.Handler):
    """streamling's warnings in a notebook: a plain ``streamling: …`` line in the cell's output (a
    notice such as "resuming the checkpoint with a different set of nodes" is not an error, and
    Python's last-resort handler would print it red on stderr); errors still go to stderr. Notes
    that only add detail (info, debug) stay out of the notebook, and outside a kernel (a job's
    driver runs notebooks in a shell of its own) the process's logging setup says everything."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        if not in_kernel():  # a terminal IPython, a job's driver: as if this handler were not there
            if not logging.getLogger().handlers and logging.lastResort is not None:
                logging.lastResort.handle(record)
            return
        try:
            stream = sys.stderr if record.levelno >= logging.ERROR else sys.stdout
            stream.write(f"streamling: {record.getMessage()}\n")
        except Exception:  # noqa: BLE001 - logging never fails the caller
            self.handleError(record)



def load_ipython_extension(ipython: Any) -> None:
    """Register the magics, the ``PipelineError`` display and (unless the kernel has them) ``dbutils``
    and a ``display`` that shows Spark DataFrames as Databricks' does.

    ``set_custom_exc`` holds one handler per shell: loading streamling replaces another extension's.
    """
    from streamling.execution import quiet_spark_python_logs
    from streamling.notebook.cells import PipelineError
    from streamling.notebook.dbutils import dbutils
    from streamling.notebook.magics import StreamlingMagics, show_pipeline_error

    if ipython.magics_manager.registry.get("StreamlingMagics") is None:  # a reload keeps the notebook's pipeline
        ipython.register_magics(StreamlingMagics)
    logger = logging.getLogger("streamling")
    if not any(isinstance(h, NotesHandler) for h in logger.handlers):
        logger.addHandler(NotesHandler())
    if PipelineError not in ipython.custom_exceptions:  # a job's driver extends it (streamling.bundle.notebook_job)
        ipython.set_custom_exc((PipelineError,), show_pipeline_error)
    magics = ipython.magics_manager.registry.get("StreamlingMagics")
    # py4j's and PySpark's own reports of a failure (a Python traceback, a JSON line holding the
    # Java plan) would reach the cell before our one-line error: silenced as the CLI does, and
    # shown again while StreamlingMagics.full_traceback is on (see its observer).
    quiet_spark_python_logs(debug=bool(getattr(magics, "full_traceback", False)))
    if "dbutils" not in ipython.user_ns:  # on Databricks the real dbutils wins
        ipython.user_ns["dbutils"] = dbutils
    if "display" not in ipython.user_ns:  # IPython's is a builtin; Databricks' own wins
        from streamling.notebook.frames import display

        ipython.user_ns["display"] = display
