"""``parallelism`` does what Streamling documents on Spark (and changing it keeps the checkpoint);
``enforce_primary_keys`` turns a sink without a key from a warning into an error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamling.errors import ValidationError
from streamling.runtime import events as ev


def _files_per_commit(table: Path) -> list[int]:
    counts = []
    for entry in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in entry.read_text().splitlines() if line.strip()]
        adds = [a for a in actions if "add" in a and a["add"].get("size", 0) > 0 and a["add"].get("dataChange")]
        if adds:
            counts.append(len(adds))
    return counts


def test_parallelism_spreads_writers_and_a_change_keeps_the_checkpoint(runner, read_delta) -> None:
    lake = runner.tmp_path / "lake"
    template = """
        sources:
          orders: {{type: generate, rows: 60, rows_per_batch: 30}}
        transforms:
          big: {{type: sql, sql: "SELECT id, amount FROM orders", parallelism: 2}}
        sinks:
          lake: {{type: delta, from: big, path: "{lake}", parallelism: {n}}}
    """
    runner.run(template.format(lake=lake, n=3))
    assert _files_per_commit(lake) == [3, 3]  # two epochs, three writers each
    assert sorted(r["id"] for r in read_delta(lake)) == list(range(60))

    runner.events.clear()
    runner.run(template.format(lake=lake, n=2))  # a different parallelism resumes the same checkpoint
    assert runner.of_type(ev.EpochFlushed) == []
    assert len(read_delta(lake)) == 60


def test_enforce_primary_keys_turns_the_missing_key_warning_into_an_error(runner, caplog) -> None:
    yaml = """
        sources:
          s: {type: generate, rows: 5}
        sinks:
          out: {type: blackhole, from: s}
    """
    runner.pipeline(yaml).analyze()
    assert any(r.getMessage().startswith("blackhole sink 'out': no primary key") for r in caplog.records)
    with pytest.raises(ValidationError) as info:
        runner.pipeline(yaml, enforce_primary_keys=True).analyze()
    assert [p.headline() for p in info.value.problems] == [
        "blackhole sink 'out': no primary key (none declared, none inherited from its inputs): updates and "
        "deletes cannot be matched to earlier rows, and enforce_primary_keys is on — declare primary_key on the "
        "sink or on a node upstream"]


def test_record_batch_size_sizes_the_arrow_batches_of_python_operators(spark, tmp_path) -> None:
    from streamling.config import load_settings
    from streamling.runtime.session import build_session

    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)
    try:
        build_session(load_settings(environ={"STREAMLING__RECORD_BATCH_SIZE": "250"}, cwd=tmp_path))
        assert spark.conf.get(key) == "250"
        import pyarrow as pa

        sizes = spark.range(1000).mapInArrow(
            lambda batches: (pa.RecordBatch.from_pydict({"n": [b.num_rows]}) for b in batches), "n long").collect()
        assert max(r.n for r in sizes) == 250
    finally:
        spark.conf.set(key, before)
