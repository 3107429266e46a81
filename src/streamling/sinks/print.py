"""``print`` sink: one line per sampled row, in Streamling's format, on stdout.

``{n} -> (sample_every={k}) [Insert|Update|Delete] {json}`` where ``n`` counts the rows this sink
has received since the process started and the JSON keeps the column order (``_gs_op`` included).
The JSON is encoded from each column's Arrow type as arrow-json encodes it (``arrow_json``), which is
what Streamling logs: float32 values in their own shortest form, NaN and infinities as ``null``,
decimals unquoted.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, TextIO

from pydantic import Field

from streamling.runtime.nodes import GS_OP, Epoch, NodeContext, Sink
from streamling.sinks.arrow_json import encode_rows
from streamling.sinks.common import arrow_chunks
from streamling.spec.options import FromNodeOptions

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

OP_NAMES = {"i": "Insert", "u": "Update", "d": "Delete"}


class PrintSinkOptions(FromNodeOptions):
    type: Literal["print"] = "print"
    sample_every: int | None = Field(default=None, ge=1)
    num_records_before_stop: int | None = Field(default=None, ge=1)


def format_line(n: int, sample_every: int, op: object, body: str) -> str:
    """One printed line: ``op`` is the row's ``_gs_op`` (null meaning insert), ``body`` its JSON."""
    label = OP_NAMES.get(str(op or "i").lower(), "Insert")
    return f"{n} -> (sample_every={sample_every}) [{label}] {body}"


def format_lines(rows: pa.RecordBatch | pa.Table, numbers: Sequence[int], sample_every: int) -> list[str]:
    """The lines of ``rows``, numbered ``numbers`` (one per row)."""
    ops = rows.column(GS_OP).to_pylist() if GS_OP in rows.schema.names else [None] * rows.num_rows
    return [format_line(n, sample_every, op, body)
            for n, op, body in zip(numbers, ops, encode_rows(rows), strict=True)]


class PrintSink(Sink[PrintSinkOptions]):
    def __init__(self, ctx: NodeContext, out: TextIO | None = None) -> None:
        super().__init__(ctx)
        self.sample_every = self.options.sample_every or ctx.settings.print_sink.sample_every
        self.stop_after = self.options.num_records_before_stop
        self.out = out
        self.count = 0
        self._lock = threading.Lock()

    def write(self, df: DataFrame, epoch: Epoch) -> int:
        """Print the epoch chunk by chunk (``arrow_chunks``): stdout is the driver's, but the epoch
        need not fit in its memory. Lines keep the epoch's order and numbering."""
        out = self.out or sys.stdout
        k = self.sample_every
        received = 0
        with self._lock:
            for chunk in arrow_chunks(df):
                first = self.count
                if k == 1:
                    lines = format_lines(chunk, range(first + 1, first + chunk.num_rows + 1), 1)
                else:
                    picks = [i for i in range(chunk.num_rows) if (first + i + 1) % k == 0]
                    lines = []
                    if picks:
                        import pyarrow as pa

                        lines = format_lines(chunk.take(pa.array(picks)), [first + i + 1 for i in picks], k)
                self.count += chunk.num_rows
                received += chunk.num_rows
                if lines:
                    try:
                        out.write("\n".join(lines) + "\n")
                        out.flush()
                    except BrokenPipeError as exc:
                        # The reader of stdout is gone (``| head``): retrying cannot bring it back.
                        raise self.ctx.error(f"stdout was closed while printing epoch {epoch.epoch_id} (broken "
                                             "pipe); the epoch is not committed and is printed again on the next "
                                             "run", code="print_closed",
                                             hint="keep the reader of stdout open, or use a sink that stores rows "
                                                  "(e.g. blackhole to discard them)") from exc
        return received

    def wants_stop(self) -> bool:
        return self.stop_after is not None and self.count >= self.stop_after
