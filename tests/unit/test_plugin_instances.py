"""Executor-side plugin instances kept between epochs: reused after success, closed and dropped after a
failure, bounded, one version per family, and a sink plugin under the testing kit's SinkRunner."""

from __future__ import annotations

import os
import pickle
from typing import Any

import pyarrow as pa
import pytest

from streamling.errors import StreamlingError
from streamling.plugins import PluginEpoch, SinkPlugin
from streamling.plugins.instances import InstanceCache, close_quietly
from streamling.plugins.testing import SinkRunner


class Thing:
    made = 0

    def __init__(self, name: str = "") -> None:
        Thing.made += 1
        self.name = name or f"thing-{Thing.made}"
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


def _cache(capacity: int = 4) -> tuple[InstanceCache[Thing], list[str]]:
    closed: list[str] = []

    def close(thing: Thing) -> None:
        thing.close()
        closed.append(thing.name)

    return InstanceCache(capacity, close), closed


def test_an_instance_is_kept_after_a_clean_use_and_handed_back_for_its_key() -> None:
    cache, closed = _cache()
    with cache.lease("f", "v", lambda: Thing("a")) as first:
        pass
    with cache.lease("f", "v", lambda: Thing("b")) as second:
        assert len(cache) == 0  # checked out while in use
    assert second is first and closed == [] and cache.keys() == [("f", "v")]
    with cache.lease("other", "v", lambda: Thing("c")) as third:
        assert third is not first


def test_an_instance_whose_use_raised_is_closed_and_never_handed_out_again() -> None:
    cache, closed = _cache()
    with cache.lease("f", "v", lambda: Thing("a")):
        pass
    with pytest.raises(ValueError), cache.lease("f", "v", lambda: Thing("b")) as used:
        assert used.name == "a"
        raise ValueError("write failed")
    assert closed == ["a"] and len(cache) == 0
    with cache.lease("f", "v", lambda: Thing("fresh")) as replay:
        assert replay.name == "fresh"


def test_a_lease_left_half_way_by_a_closed_generator_drops_the_instance() -> None:
    cache, closed = _cache()

    def task() -> Any:
        with cache.lease("f", "v", lambda: Thing("a")):
            yield 1
            yield 2

    gen = task()
    next(gen)
    gen.close()  # the task stopped before its epoch was flushed
    assert closed == ["a"] and len(cache) == 0


def test_beyond_capacity_the_least_recently_used_instance_is_closed() -> None:
    cache, closed = _cache(capacity=2)
    for name in ("a", "b"):
        with cache.lease(name, "v", lambda n=name: Thing(n)):
            pass
    with cache.lease("a", "v", lambda: Thing("never")):  # a is now the most recently used
        pass
    with cache.lease("c", "v", lambda: Thing("c")):
        pass
    assert closed == ["b"] and cache.keys() == [("a", "v"), ("c", "v")]
    cache.close_all()
    assert sorted(closed) == ["a", "b", "c"] and len(cache) == 0


def test_a_new_version_of_a_family_closes_the_older_ones() -> None:
    cache, closed = _cache()
    with cache.lease("f", "token-1", lambda: Thing("old")):
        pass
    with cache.lease("g", "token-1", lambda: Thing("other family")):
        pass
    with cache.lease("f", "token-2", lambda: Thing("new")) as new:
        assert new.name == "new"
    assert closed == ["old"] and sorted(cache.keys()) == [("f", "token-2"), ("g", "token-1")]


def test_two_uses_of_one_key_at_once_get_two_instances_and_one_is_kept() -> None:
    cache, closed = _cache()
    with cache.lease("f", "v", lambda: Thing("a")) as a, cache.lease("f", "v", lambda: Thing("b")) as b:
        assert a is not b
    assert len(cache) == 1 and len(closed) == 1


def test_a_forked_child_keeps_nothing_of_its_parent() -> None:
    cache, closed = _cache()
    with cache.lease("f", "v", lambda: Thing("parent's")):
        pass
    cache._pid = os.getpid() + 1  # as a child sees the parent's cache after a fork
    with cache.lease("f", "v", lambda: Thing("child's")) as thing:
        assert thing.name == "child's"
    assert closed == []  # the parent's instance is not the child's to close


def test_closing_quietly_logs_a_failing_close(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        def close(self) -> None:
            raise OSError("socket gone")

    close_quietly(Broken())
    assert "closing Broken failed: OSError: socket gone" in caplog.text


class CountingSink(SinkPlugin[Any]):
    plugin_id = "unittest.counting_sink"
    made: list[int] = []
    closed: list[int] = []
    flushed: list[tuple[int, int]] = []
    fail_on: set[tuple[int, int]] = set()

    def __init__(self, ctx: Any) -> None:
        super().__init__(ctx)
        CountingSink.made.append(ctx.partition)

    def write_batch(self, batch: pa.RecordBatch, epoch: PluginEpoch) -> None:
        if (epoch.epoch_id, epoch.partition) in self.fail_on:
            self.fail_on.discard((epoch.epoch_id, epoch.partition))
            raise ConnectionError("target away")

    def on_epoch_flushed(self, epoch: PluginEpoch) -> None:
        CountingSink.flushed.append((epoch.epoch_id, epoch.partition))

    def close(self) -> None:
        if self.ctx.role == "executor":
            CountingSink.closed.append(self.ctx.partition)


def test_the_testing_kit_keeps_a_partitions_sink_instance_across_epochs_and_replaces_a_failed_one() -> None:
    CountingSink.made, CountingSink.closed, CountingSink.flushed = [], [], []
    CountingSink.fail_on = {(1, 1)}
    batch = pa.RecordBatch.from_pydict({"id": [1], "_gs_op": ["i"]})
    sink = SinkRunner(CountingSink, None, batch.schema)
    made_by_driver = list(CountingSink.made)
    assert made_by_driver == [-1]
    sink.write_epoch([[batch], [batch]])
    with pytest.raises(StreamlingError) as info:
        sink.write_epoch([[batch], [batch]])
    assert info.value.retriable
    assert CountingSink.closed == [1]  # the failed instance, at once
    sink.write_epoch([[batch], [batch]], epoch=1)  # the replay: partition 1 gets a fresh instance
    sink.write_epoch([[batch], [batch]])
    assert CountingSink.made == [-1, 0, 1, 1]
    assert CountingSink.flushed == [(0, 0), (0, 1), (1, 0), (1, 0), (1, 1), (2, 0), (2, 1)]
    sink.close()
    assert sorted(CountingSink.closed) == [0, 1, 1]


def test_a_job_names_the_family_of_its_instances_and_ships_its_run_id() -> None:
    from streamling.plugins.api import NoOptions
    from streamling.plugins.host import PluginJob

    schema = pa.schema([("id", pa.int64())])
    job = PluginJob(CountingSink, "unittest.counting_sink", "sink", "out", NoOptions(), input_schema=schema)
    shipped = pickle.loads(pickle.dumps(job))
    assert shipped.instance_family(3) == job.instance_family(3) != job.instance_family(4)
    again = PluginJob(CountingSink, "unittest.counting_sink", "sink", "out", NoOptions(), input_schema=schema)
    assert again.instance_family(3) != job.instance_family(3)  # another run of the node
    job.input_schema = pa.schema([("id", pa.string())])
    assert job.instance_family(3) != shipped.instance_family(3)
