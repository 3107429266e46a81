"""The generate source read in the JVM gives the Python data source's rows, epochs and offsets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from streamling.sources.generate import generate_stream
from streamling.sources.generate_rows import generate_exprs

pytestmark = pytest.mark.spark


def _epochs(spark: Any, options: dict[str, object], native: bool, checkpoint: Path) -> dict[int, pa.Table]:
    got: dict[int, pa.Table] = {}

    def collect(batch: Any, batch_id: int) -> None:
        got[batch_id] = batch.toArrow()

    query = (generate_stream(spark, options, native=native).writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None
    return got


@pytest.mark.parametrize("profile", ["orders", "cdc"])
def test_same_epochs_and_rows_in_the_jvm_as_in_python(spark: Any, tmp_path: Path, profile: str) -> None:
    options: dict[str, object] = {"rows": 1000, "rows_per_batch": 300, "partitions": 3, "seed": 11,
                                  "start_id": -40, "profile": profile}
    python = _epochs(spark, options, False, tmp_path / "py")
    jvm = _epochs(spark, options, True, tmp_path / "jvm")
    assert sorted(jvm) == sorted(python) == [0, 1, 2, 3]
    for epoch, table in python.items():
        assert jvm[epoch].schema == table.schema, (str(jvm[epoch].schema), str(table.schema))
        assert jvm[epoch].equals(table), epoch  # same rows, same order within the epoch
    assert [t.num_rows for _, t in sorted(jvm.items())] == [300, 300, 300, 100]


def test_either_implementation_resumes_the_others_checkpoint(spark: Any, tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    first = _epochs(spark, {"rows": 500, "rows_per_batch": 200}, False, checkpoint)
    second = _epochs(spark, {"rows": 900, "rows_per_batch": 200}, True, checkpoint)
    third = _epochs(spark, {"rows": 1000, "rows_per_batch": 200}, False, checkpoint)
    ids = [table.column("id").to_pylist() for _, table in sorted({**first, **second, **third}.items())]
    assert sorted(first) == [0, 1, 2] and sorted(second) == [3, 4] and sorted(third) == [5]
    assert [i for chunk in ids for i in chunk] == list(range(1000))  # nothing twice, nothing missed


def test_row_values_past_the_int64_wrap_match_numpy(spark: Any) -> None:
    # Row indexes from ~1.7e9 on overflow idx * MIX in int64: numpy wraps, the JVM reproduces it exactly.
    from streamling.sources.generate_rows import generate_batch

    for start in (1_737_000_000, 2**42, 2**62 - 300):
        expected = pa.Table.from_batches([generate_batch("orders", start, start + 200, -7, 3)])
        got = (spark.range(start, start + 200).withColumnRenamed("id", "idx")
               .selectExpr(*generate_exprs("idx", "orders", -7, 3)).toArrow())
        assert got.column("customer").to_pylist() == expected.column("customer").to_pylist()
        assert got.column("amount").to_pylist() == expected.column("amount").to_pylist()
        assert got.column("quantity").to_pylist() == expected.column("quantity").to_pylist()
        assert got.column("created_at").cast(pa.int64()).equals(expected.column("created_at").cast(pa.int64()))
