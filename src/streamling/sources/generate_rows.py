"""The rows and the Python data source of the ``generate`` source, apart from its node class.

Spark's Python workers (the schema lookup, the streaming planner, every reading task) unpickle the
data source and import this module by reference; it imports only pyarrow (numpy where rows are
built), not the pipeline model and settings the node class needs, which took ~0.5 s per worker.
Row ``i`` is a pure function of ``(seed, i)``, so a replayed epoch yields the very same rows.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMAT = "streamling_generate"
COUNTRIES = ["US", "DE", "FR", "GB", "JP", "BR", "IN", "CA", "AU", "ES"]
CUSTOMERS = [f"customer-{i:04d}" for i in range(1000)]
BASE_TS_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z
#: Row ``idx`` mixes as ``(idx * MIX + seed * 40503) % MIX_MOD``.
MIX, MIX_MOD = 2654435761, 1_000_003
#: Below this row index ``idx * MIX + seed * 40503`` stays in int64 (``GenerateSourceOptions`` bounds
#: ``seed`` to int32 and ``start_id`` to ±2^62, so ids and the salt fit int64 too).
_NO_WRAP_BELOW = (2**62) // MIX
SCHEMAS = {
    "orders": "id BIGINT, customer STRING, country STRING, amount DOUBLE, quantity INT, "
              "created_at TIMESTAMP, _gs_op STRING",
    "cdc": "id BIGINT, version INT, customer STRING, amount DOUBLE, _gs_op STRING",
}


def generate_batch(profile: str, start: int, end: int, seed: int, start_id: int) -> pa.RecordBatch:
    """Rows ``[start, end)`` of the stream, built column-wise (no per-row Python)."""
    import numpy as np

    idx = np.arange(start, end, dtype=np.int64)
    mixed = (idx * MIX + seed * 40503) % MIX_MOD
    customers = pa.array(CUSTOMERS).take(pa.array(mixed % len(CUSTOMERS)))
    amount = pa.array(((mixed % 100_000) / 100.0).astype(np.float64))
    if profile == "cdc":
        # Three events per key: insert, update, then update or (every 5th key) delete.
        key = idx // 3 + start_id
        step = idx % 3
        ops = np.where(step == 0, "i", np.where((step == 2) & (key % 5 == 0), "d", "u"))
        return pa.RecordBatch.from_arrays(
            [pa.array(key), pa.array((step + 1).astype(np.int32)), customers, amount, pa.array(ops)],
            names=["id", "version", "customer", "amount", "_gs_op"])
    ids = idx + start_id
    countries = pa.array(COUNTRIES).take(pa.array(mixed % len(COUNTRIES)))
    quantity = pa.array((mixed % 9 + 1).astype(np.int32))
    created = pa.array(BASE_TS_US + ids * 1_000_000, type=pa.timestamp("us", tz="UTC"))
    ops = pa.array(np.full(len(idx), "i"))
    return pa.RecordBatch.from_arrays(
        [pa.array(ids), customers, countries, amount, quantity, created, ops],
        names=["id", "customer", "country", "amount", "quantity", "created_at", "_gs_op"])


def generate_exprs(idx: str, profile: str, seed: int, start_id: int) -> list[str]:
    """``generate_batch``'s columns as Spark SQL expressions of the row index column ``idx`` (same
    values, same types, bit for bit): the JVM reads a batch with no Python worker. SQL text, so
    building them costs one JVM call (``selectExpr``), not one per function.

    numpy computes ``idx * MIX + seed * 40503`` in wrapping int64 and ``%`` as a floor modulo;
    past ``_NO_WRAP_BELOW`` the wrap is reproduced in exact decimal arithmetic, and ``pmod`` is
    the floor modulo. ``idx`` is nullable and so is every column, as the Python source declares them."""
    salt = seed * 40503
    col = f"`{idx}`"

    def wrap64(x: str) -> str:
        return f"(pmod({x} + {2**63}BD, {2**64}BD) - {2**63}BD)"

    exact = wrap64(f"{wrap64(f'CAST({col} AS DECIMAL(38,0)) * {MIX}BD')} + ({salt}BD)")
    mixed = (f"(CASE WHEN {col} < {_NO_WRAP_BELOW}L THEN pmod({col} * {MIX}L + ({salt}L), {MIX_MOD}L) "
             f"ELSE CAST(pmod({exact}, {MIX_MOD}BD) AS BIGINT) END)")
    customer = f"concat('customer-', lpad(CAST({mixed} % {len(CUSTOMERS)} AS STRING), 4, '0')) AS customer"
    amount = f"CAST({mixed} % 100000 AS DOUBLE) / 100.0D AS amount"
    if profile == "cdc":
        key = f"(({col} div 3) + ({start_id}L))"
        step = f"pmod({col}, 3)"
        op = (f"CASE WHEN {col} IS NULL THEN NULL WHEN {step} = 0 THEN 'i' "
              f"WHEN {step} = 2 AND pmod({key}, 5) = 0 THEN 'd' ELSE 'u' END AS _gs_op")
        return [f"{key} AS id", f"CAST({step} + 1 AS INT) AS version", customer, amount, op]
    ids = f"({col} + ({start_id}L))"
    wrapped_micros = wrap64(f"{BASE_TS_US}BD + " + wrap64(f"CAST({ids} AS DECIMAL(38,0)) * 1000000BD"))
    countries = ", ".join(f"'{c}'" for c in COUNTRIES)
    return [f"{ids} AS id", customer,
            f"CASE WHEN {col} IS NOT NULL THEN element_at(array({countries}), "
            f"CAST({mixed} % {len(COUNTRIES)} + 1 AS INT)) END AS country",
            amount, f"CAST({mixed} % 9 + 1 AS INT) AS quantity",
            f"timestamp_micros(CASE WHEN abs({ids}) < 9000000000000L THEN {BASE_TS_US}L + {ids} * 1000000L "
            f"ELSE CAST({wrapped_micros} AS BIGINT) END) AS created_at",
            f"CASE WHEN {col} IS NOT NULL THEN 'i' END AS _gs_op"]


def _data_source_class() -> type:
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    class RangePartition(InputPartition):
        def __init__(self, start: int, end: int) -> None:
            super().__init__((start, end))
            self.start, self.end = start, end

    class GenerateStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
        def __init__(self, options: dict[str, str]) -> None:
            self.total = int(options["rows"]) if options.get("rows") not in (None, "", "None") else None
            rate = options.get("rows_per_second")
            self.rate = float(rate) if rate not in (None, "", "None") else None
            self.per_batch = int(options.get("rows_per_batch", "100000"))
            self.partitions_n = int(options.get("partitions", "2"))
            self.seed = int(options.get("seed", "0"))
            self.start_id = int(options.get("start_id", "0"))
            self.profile = options.get("profile", "orders")
            self._clock: tuple[float, int] | None = None
            self._available_now = False
            self._available_now_end: int | None = None

        def initialOffset(self) -> dict[str, Any]:
            return {"row": 0}

        def _ceiling(self, start: int) -> int:
            ceiling = self.total if self.total is not None else 2**62
            if self.rate is not None:
                now = time.monotonic()
                if self._clock is None:
                    # Start the clock one second (at least one row) in the past: Spark plans the
                    # first epoch from the first answer, which would otherwise release no row and
                    # leave epoch 0 empty (nothing to sample or capture until epoch 1).
                    self._clock = (now - max(1.0, 1.0 / self.rate), start)
                t0, base = self._clock
                ceiling = min(ceiling, base + int((now - t0) * self.rate))
            if self._available_now and self.total is None:
                if self._available_now_end is None:
                    self._available_now_end = ceiling  # what the clock has released by the first ask
                ceiling = min(ceiling, self._available_now_end)
            return ceiling

        def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
            begin = int(start["row"])
            return {"row": max(begin, min(begin + self.per_batch, self._ceiling(begin)))}

        def prepareForTriggerAvailableNow(self) -> None:
            """Bounded: ``rows`` already caps every offset. Rate-limited: drain what the clock has
            released by the first ``latestOffset``, then stop — its clock starts at that call's
            offset, the checkpoint's (starting it here, at row 0, drained nothing on a resume)."""
            self._available_now = True

        def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
            lo, hi = int(start["row"]), int(end["row"])
            if hi <= lo:
                return []
            n = max(1, min(self.partitions_n, hi - lo))
            step = -(-(hi - lo) // n)
            return [RangePartition(s, min(s + step, hi)) for s in range(lo, hi, step)]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            chunk = 65_536
            for s in range(partition.start, partition.end, chunk):  # type: ignore[attr-defined]
                e = min(s + chunk, partition.end)  # type: ignore[attr-defined]
                yield generate_batch(self.profile, s, e, self.seed, self.start_id)

        def commit(self, end: dict[str, Any]) -> None:
            return None

    class GenerateDataSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return FORMAT

        def schema(self) -> str:
            return SCHEMAS[self.options.get("profile", "orders")]

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return GenerateStreamReader(dict(self.options))

    return GenerateDataSource


def register_generate(spark: SparkSession) -> None:
    from streamling.runtime.session import register_data_source

    register_data_source(spark, FORMAT, _data_source_class)
