"""The generate source's reader without a JVM: what Spark's first planning call gets."""

from __future__ import annotations

from typing import Any

import pytest

from streamling.sources.generate import _data_source_class


def _reader(**options: str) -> Any:
    return _data_source_class()(options).streamReader(None)


def test_the_first_epoch_of_a_rate_limited_source_has_rows() -> None:
    # Spark plans epoch 0 from the first latestOffset: it must release rows already, so a sample
    # (and `%streamling capture`) has data from the first epoch on.
    for rate, first in (("50", 50), ("0.5", 1), ("1000", 1000)):
        reader = _reader(rows_per_second=rate)
        end = reader.latestOffset(reader.initialOffset(), None)["row"]
        assert first <= end <= first + 5, (rate, end)
        assert len(reader.partitions({"row": 0}, {"row": end})) >= 1
    # A restart resumes from the checkpoint's offset, with a first epoch of rows again.
    reader = _reader(rows_per_second="10", rows="1000")
    assert 10 <= reader.latestOffset({"row": 400}, None)["row"] - 400 <= 12
    # Unthrottled and bounded sources are unchanged: a whole batch, capped by rows.
    assert _reader(rows="30").latestOffset({"row": 0}, None) == {"row": 30}
    assert _reader(rows_per_batch="7").latestOffset({"row": 0}, None) == {"row": 7}


@pytest.mark.parametrize("start", [0, 5000], ids=["first-run", "resumed"])
def test_available_now_on_a_rate_limited_source_drains_released_rows(start: int) -> None:
    # The clock starts at the first ask's offset (the checkpoint's on a resume), as the JVM reader's
    # does: a resumed run drains what the clock released since, instead of nothing.
    reader = _reader(rows_per_second="20")
    reader.prepareForTriggerAvailableNow()
    end = reader.latestOffset({"row": start}, None)["row"]
    assert start + 20 <= end <= start + 25
    assert reader.latestOffset({"row": end}, None) == {"row": end}


def test_seed_and_start_id_are_bounded_where_both_readers_agree() -> None:
    from pydantic import ValidationError

    from streamling.spec.sources import GenerateSourceOptions

    GenerateSourceOptions(rows=1, seed=2**31 - 1, start_id=-(2**62))
    for bad in ({"seed": 2**31}, {"start_id": 2**62 + 1}):
        with pytest.raises(ValidationError):
            GenerateSourceOptions(rows=1, **bad)


def test_a_python_worker_unpickling_the_source_imports_no_pipeline_model() -> None:
    # Every Spark Python worker that runs the source (schema lookup, streaming planner, reading
    # tasks) unpickles it; importing the pipeline model and settings there cost ~0.5 s per worker.
    import json
    import subprocess
    import sys

    from pyspark import cloudpickle

    payload = cloudpickle.dumps(_data_source_class())
    probe = ("import json, pickle, sys; cls = pickle.loads(sys.stdin.buffer.read()); "
             "reader = cls({'rows': '4', 'partitions': '1'}).streamReader(None); "
             "batch = next(reader.read(reader.partitions({'row': 0}, {'row': 4})[0])); "
             "loaded = sorted(m for m in sys.modules if m.startswith(('streamling', 'pydantic'))); "
             "print(json.dumps([batch.num_rows, loaded]))")
    out = subprocess.run([sys.executable, "-c", probe], input=payload, capture_output=True, check=True).stdout
    assert json.loads(out) == [4, ["streamling", "streamling.sources", "streamling.sources.generate_rows"]]
