"""``webhook`` sink: each epoch's rows are POSTed like a ``handler``'s and the answers ignored.

The requests go out from the driver over the epoch read in chunks (``arrow_chunks``, so the driver
never holds the whole epoch): like
Streamling's single webhook write stream, there is one ordered sender per sink whose concurrency
is exactly ``external_http_handler.buffer_size`` (per-partition senders on executors would
multiply it by the partition count), and a failure surfaces here directly with its status. The
upstream plan still runs in parallel on the executors; only the sending is on the driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal

from streamling.errors import NodeFailure, node_failure_from_text
from streamling.http.client import HttpSender, build_call, encode_requests, rounds
from streamling.runtime.nodes import Epoch, NodeContext, Sink
from streamling.sinks.common import arrow_chunks
from streamling.spec.options import HttpNodeOptions

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


class WebhookSinkOptions(HttpNodeOptions):
    """Rows are sent like a ``handler``'s and the responses ignored."""

    type: Literal["webhook"] = "webhook"
    skip_on_error: bool = False


class WebhookSink(Sink[WebhookSinkOptions]):
    #: ``batch_size`` bounds the rows of one batch-mode request
    honoured_keys: ClassVar[frozenset[str]] = frozenset({"batch_size"})

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        self.call = build_call(ctx, self.options, "webhook sink", skip_on_error=self.options.skip_on_error)
        self.skipped = 0

    def write(self, df: DataFrame, epoch: Epoch) -> int:
        """Send the whole epoch; return once every request was answered (or skipped)."""
        sent = 0
        sender: HttpSender | None = None
        try:
            for rows in rounds(arrow_chunks(df), self.call.concurrency * self.call.rows_per_request):
                sender = sender or HttpSender(self.call)
                sender.send_all([body for _, body in encode_requests(rows, self.call)])
                sent += len(rows)
        except NodeFailure as exc:
            # Already final (retries ran out): a StreamlingError that is not retriable, so the flow
            # does not send the whole epoch again.
            raise (node_failure_from_text(str(exc)) or self.ctx.error(str(exc))) from exc
        finally:
            if sender is not None:
                sender.close()
                self.skipped += sender.skipped
        return sent
