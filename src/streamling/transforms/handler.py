"""``handler`` transform: rows go to an HTTP endpoint and its JSON answers become the output rows.

It is an ``ArrowTransform``: each Spark partition's Arrow batches are regrouped into requests
(one row per request, or JSON arrays of up to ``batch_size``/``trigger_max_count`` rows) and sent
from the Python worker with ``buffer_size`` requests in flight. Answers are put back in request
order, so output rows keep the order of the rows that produced them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar

from streamling.http.client import HttpCall, HttpSender, build_call, encode_requests, response_rows, rounds
from streamling.runtime.nodes import Epoch, NodeContext
from streamling.spec.transforms import HandlerTransformOptions
from streamling.spec.types import decimal_texts, from_metadata, parse_type, with_wide_metadata
from streamling.transforms.arrow import ArrowTransform, BatchFunction

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType


class HandlerTransform(ArrowTransform[HandlerTransformOptions]):
    #: ``batch_size`` bounds the rows of one batch-mode request
    honoured_keys: ClassVar[frozenset[str]] = frozenset({"parallelism", "batch_size"})

    def __init__(self, ctx: NodeContext) -> None:
        super().__init__(ctx)
        # Resolved now so a missing or clashing secret stops the pipeline before any query starts.
        self.call = build_call(ctx, self.options, "handler transform")

    def output_schema(self, input_schema: StructType) -> StructType:
        """The input's columns, retyped, added (at the end) or dropped (null) by ``schema_override``."""
        from pyspark.sql.types import StructType

        fields = {f.name: f for f in input_schema.fields}
        for column, type_name in (self.options.schema_override or {}).items():
            if type_name is None:
                fields.pop(column, None)
            else:
                fields[column] = parse_type(type_name).spark_field(column)
        return StructType(list(fields.values()))

    def batch_function(self, input_schema: StructType, epoch: Epoch | None) -> BatchFunction:
        from pyspark.sql import SparkSession
        from pyspark.sql.pandas.types import to_arrow_schema

        active = SparkSession.getActiveSession()
        timezone = active.conf.get("spark.sql.session.timeZone") if active is not None else "UTC"
        out = self.output_schema(input_schema)
        schema = with_wide_metadata(to_arrow_schema(out, timezone=timezone or "UTC"), out)
        return _handler_batches(self.call, schema)


def _handler_batches(call: HttpCall, schema: pa.Schema) -> BatchFunction:
    """The worker-side loop; a closure over plain data only, so Spark can pickle it."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        sender = HttpSender(call)
        try:
            for rows in rounds(batches, call.concurrency * call.rows_per_request):
                requests = encode_requests(rows, call)
                responses = sender.send_all([body for _, body in requests])
                out: list[dict[str, Any]] = []
                for (sent, _), response in zip(requests, responses, strict=True):
                    if response is not None:
                        out.extend(response_rows(call, response, sent))
                if out:
                    yield to_record_batch(call, out, schema)
        finally:
            sender.close()

    return run


def to_record_batch(call: HttpCall, rows: list[dict[str, Any]], schema: pa.Schema) -> pa.RecordBatch:
    """Answers as a batch of the output schema: missing keys are null, unknown keys are ignored.

    JSON has no timestamps or decimals, so a column Arrow cannot build directly (ISO-8601 text
    for a timestamp, a number for a decimal) is built as JSON gave it and then cast.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    arrays = []
    for field in schema:
        values = [r.get(field.name) for r in rows]
        wide = from_metadata(field.metadata)
        if wide is not None:  # exact decimal text, or a failure: never narrowed
            try:
                arrays.append(decimal_texts(values, wide, field.name))
            except ValueError as exc:
                raise call.failure(f"response {exc}", hint="answer with a decimal (string or number) that fits "
                                   f"{wide.name}, or change the column's type in schema_override") from None
            continue
        try:
            arrays.append(pa.array(values, type=field.type))
            continue
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError, ValueError):
            pass
        try:
            raw = pa.array(values)
            if pa.types.is_timestamp(field.type) and pa.types.is_string(raw.type):
                raw = pc.cast(raw, pa.timestamp(field.type.unit, "UTC"))
            arrays.append(pc.cast(raw, field.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError, TypeError,
                ValueError) as exc:
            sample = next((v for v in values if v is not None), None)
            raise call.failure(f"response field '{field.name}' does not fit type {field.type} "
                               f"(e.g. {sample!r}): {exc}",
                               hint="fix the endpoint's answer or the column's type in schema_override") from None
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
