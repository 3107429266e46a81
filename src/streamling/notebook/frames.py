"""``display(df)``: any Spark DataFrame in a ``ResultView``, as Databricks' ``display`` shows it.

A batch DataFrame's first rows are read once; a streaming one runs a query of its own whose every
micro-batch feeds the view, and the cell follows it until it ends or is interrupted. The view and
the pipeline's node displays are ``notebook.display``'s.
"""

from __future__ import annotations

import time
from typing import Any

from streamling.errors import StreamlingError, java_message, spark_sql_message
from streamling.notebook.display import MAX_ROWS, ResultView, is_dataframe
from streamling.runtime import events as ev

#: rows ``display(df)`` shows of a DataFrame, as Databricks' display does by default
FRAME_ROWS = 1000


class StreamingDisplay:
    """The query behind ``display(streaming_df)`` and the view it feeds."""

    def __init__(self, view: ResultView, query: Any, errors: list[BaseException] | None = None) -> None:
        self.view, self.query = view, query
        #: what the micro-batch function raised, in Python's own words (the query's exception only
        #: says "an exception was raised by the Python Proxy")
        self.errors = errors if errors is not None else []

    def stop(self, status: str = "stopped") -> None:
        self.query.stop()
        self.view.keep_beating(False)
        self.view.update_view(status=status)

    def wait(self, timeout_secs: float | None = None) -> bool:
        """True once the query ended (a bounded source, ``stop``); a failed query fails the call and
        the view says why."""
        deadline = None if timeout_secs is None else time.monotonic() + timeout_secs
        while self._active():
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.25)  # an interrupt (JupyterLab's Stop) lands here, in Python, not inside py4j
        failure = self.query.exception()
        self.view.keep_beating(False)
        if failure is not None:
            message = spark_sql_message(self.errors[-1]) if self.errors else java_message(failure)
            self.view.update_view(status=f"failed: {message}")
            raise StreamlingError(f"display: the streaming query failed: {message}",
                                  hint="fix the query; df.explain() shows its plan")
        self.view.update_view(status="stopped")
        return True

    def _active(self) -> bool:
        try:
            return bool(self.query.isActive)
        except Exception as exc:
            # An interrupt inside a py4j call comes out as py4j's network error: it is the interrupt.
            if isinstance(exc.__context__, KeyboardInterrupt):
                raise KeyboardInterrupt from None
            raise


def display_dataframe(df: Any, rows: int = FRAME_ROWS, *, stream_name: str | None = None,
                      processing_time: str | None = None) -> ResultView | StreamingDisplay:
    """A view of any Spark DataFrame, as Databricks' ``display(df)`` shows it.

    A batch DataFrame: its first ``rows`` rows (sortable, downloadable as CSV or Parquet), read now.
    A streaming one: a query, started now, whose every micro-batch's rows the view shows as they
    arrive — the newest first, older batches filling up to ``rows`` — returned running."""
    if not 1 <= rows <= MAX_ROWS:
        raise StreamlingError(f"display shows 1 to {MAX_ROWS:,} rows, not {rows}", hint="pass rows=N in that range")
    label = stream_name or ("streaming DataFrame" if df.isStreaming else "DataFrame")
    view = ResultView(label, "query" if df.isStreaming else "batch", rows)
    if not df.isStreaming:
        try:
            table = df.limit(rows + 1).toArrow()
        except Exception as exc:  # noqa: BLE001 - shown as the cell's one-line error
            raise StreamlingError(f"display: the DataFrame cannot be read: {java_message(exc)}",
                                  hint="fix the query; df.explain() shows its plan") from exc
        more = table.num_rows > rows
        table = table.slice(0, rows)
        view.show_table(table, status="complete", caption=(f"the first {rows:,} rows of the DataFrame" if more
                                                           else f"all {table.num_rows:,} rows of the DataFrame"))
        return view

    view.update_view(status="running", caption=f"each micro-batch of the streaming query '{label}' as it arrives: the "
                                        f"newest first, older ones up to {rows:,} rows")

    errors: list[BaseException] = []

    def show(batch: Any, batch_id: int) -> None:
        try:
            table = batch.limit(rows).toArrow()
        except Exception as exc:
            errors.append(exc)
            raise
        view.handle(ev.RowsSampled(label, epoch=batch_id, node=label, columns=table.column_names, rows=[],
                                   table=table))

    writer = df.writeStream.foreachBatch(show)
    if stream_name:
        writer = writer.queryName(stream_name)
    if processing_time:
        writer = writer.trigger(processingTime=processing_time)
    try:
        query = writer.start()
    except Exception as exc:  # noqa: BLE001 - shown as the cell's one-line error
        raise StreamlingError(f"display: the streaming query does not start: {java_message(exc)}",
                              hint="fix the query; df.explain() shows its plan") from exc
    view.keep_beating(True)
    return StreamingDisplay(view, query, errors)


def display(*objs: Any, **kwargs: Any) -> None:
    """The notebook's ``display``: a Spark DataFrame as ``display_dataframe`` shows it — a streaming
    one keeps its cell running until the query ends or the cell is interrupted (JupyterLab's Stop),
    which stops the query, as cancelling the cell does on Databricks; Databricks' ``streamName`` and
    ``processingTime`` keywords work too. Anything else as IPython shows it."""
    from IPython.display import display as show

    if len(objs) != 1 or not is_dataframe(objs[0]):
        show(*objs, **kwargs)
        return
    known = {"streamName": "stream_name", "processingTime": "processing_time", "rows": "rows"}
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise StreamlingError(f"display(df) takes no {', '.join(unknown)}", hint=f"keywords: {', '.join(known)}")
    result = display_dataframe(objs[0], **{known[k]: v for k, v in kwargs.items()})
    if isinstance(result, ResultView):
        show(result)
        return
    show(result.view)
    try:
        result.wait()
    except KeyboardInterrupt:
        result.stop("stopped (the cell was interrupted)")
