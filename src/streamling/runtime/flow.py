"""One flow = one streaming query; its ``foreachBatch`` is the epoch.

Inside the batch function the transforms are evaluated on the micro-batch and every sink writes
and flushes; only when the function returns does Spark write ``commits/N`` and let the sources
advance. A replay after a crash re-runs batch N with the same id, which sinks use for
idempotency (or rely on primary-key upserts).

The DAG's evaluation (``epoch_dag``), the checkpoint's record (``flow_checkpoint``) and the
epoch's counts and reports (``epoch_metrics``) live apart. What stays here, somewhat over 500 lines,
is one protocol: starting an epoch, committing it and stopping the query between epochs are decided
under one lock on one query's state, and split across modules that would be harder to follow.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from streamling import storage
from streamling.errors import StreamlingError, chain_text, first_line, java_message, node_failure_from_text
from streamling.runtime import events as ev
from streamling.runtime import expectations
from streamling.runtime.environment import worker_failure
from streamling.runtime.epoch_dag import evaluate, event_time_extra, only_input
from streamling.runtime.epoch_metrics import EpochCounts, event_times, expectation_results, publish_samples
from streamling.runtime.flow_checkpoint import FlowCheckpoint
from streamling.runtime.jvm_death import jvm_failure
from streamling.runtime.nodes import Epoch, Sink, Source
from streamling.runtime.observe import (
    EVENT_TIME,
    INPUT,
    LAG_BUCKETS,
    LAG_SUM,
    RECEIVED,
    ROWS,
    EpochObservations,
)
from streamling.runtime.planner import Flow, Plan
from streamling.runtime.retry import STOPPED, call_with_retry
from streamling.runtime.side_outputs import SideOutputs
from streamling.telemetry.histogram import LAG_BOUNDARIES_MS, Buckets

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from streamling.config.settings import RetrySettings

log = logging.getLogger(__name__)
SRC_TAG = "__sl_src"
#: How an interrupted JVM thread shows in a query's error (``FlowRunner.interrupted_by_stop``)
_INTERRUPTED = ("java.lang.InterruptedException", "java.io.InterruptedIOException",
                "java.nio.channels.ClosedByInterruptException", "Failed to shutdown streamer")


class EpochNotStarted(Exception):
    """Spark began an epoch after the flow decided to stop its query: refused before any sink ran
    (returning would let Spark commit it unwritten); the epoch is planned again on the next start."""


def _not_a_stop(record: logging.LogRecord) -> bool:
    """py4j logs every exception leaving ``foreachBatch`` with its traceback; a stop request cutting
    a retry short is no failure and is reported in one line by whoever stopped the run."""
    exc = record.exc_info[1] if record.exc_info else None
    return not (isinstance(exc, EpochNotStarted) or (isinstance(exc, StreamlingError) and exc.code == STOPPED))


logging.getLogger("py4j.clientserver").addFilter(_not_a_stop)



def _lags(observed: dict[str, dict[str, Any]]) -> dict[str, Buckets]:
    """Each observed node's bucketed lags (a sink's under its own name), for the lag histogram:
    ``histogram_numeric`` gives (bucket index, rows) pairs, an index possibly in several pairs."""
    out: dict[str, Buckets] = {}
    for key, values in observed.items():
        pairs = values.get(LAG_BUCKETS)
        if not pairs:
            continue
        try:
            counts = [0] * (len(LAG_BOUNDARIES_MS) + 1)
            for pair in pairs:
                counts[int(round(pair[0]))] += int(round(pair[1]))
            # the lags' total: centre × rows of each bin of the lags' own histogram (negated lags)
            total = -sum(float(pair[0]) * float(pair[1]) for pair in values.get(LAG_SUM) or [])
            out[key.removesuffix(EVENT_TIME)] = Buckets(tuple(counts), max(0.0, total))
        except (TypeError, ValueError, IndexError):  # a metric must never fail the epoch
            log.debug("reading the lags of %s failed", key, exc_info=True)
    return out


def _json(value: Any) -> Any:
    try:
        return json.loads(value) if isinstance(value, str) else value
    except ValueError:
        return value


def partition_lag(end: Any, latest: Any) -> dict[str, int] | None:
    """Messages each partition is behind (``topic/partition`` → latest − end), from the offsets
    Spark's Kafka source reports with every epoch (``{"topic": {"0": 42}}``); None for sources
    whose offsets are not per-partition positions."""
    if not (isinstance(end, dict) and isinstance(latest, dict)):
        return None
    out: dict[str, int] = {}
    for topic, partitions in latest.items():
        done = end.get(topic)
        if not (isinstance(partitions, dict) and isinstance(done, dict)):
            return None
        for partition, position in partitions.items():
            if not (isinstance(position, int) and isinstance(done.get(partition), int)):
                return None
            out[f"{topic}/{partition}"] = max(0, position - done[partition])
    return out


class FlowRunner:
    """Starts, watches and stops the streaming query of one flow."""

    def __init__(self, plan: Plan, flow: Flow, spark: SparkSession, bus: ev.EventBus,
                 state: Any | None = None) -> None:
        self.plan = plan
        self.flow = flow
        self.spark = spark
        self.bus = bus
        self.state = state
        self.settings = plan.settings
        self.sources: list[Source] = plan.sources(flow)
        self.sinks: list[Sink] = plan.sinks(flow)
        self.side_outputs = SideOutputs(self.settings, [s.name for s in self.sources])
        self.bounded = all(s.bounded for s in self.sources)
        self.query: StreamingQuery | None = None
        self.phase = ""
        self.failure: StreamlingError | None = None
        self.rows_to_sinks = 0
        self.last_epoch: int | None = None
        #: the last unsampled epoch's seconds: a sampled epoch's extra time (caching the batch, the
        #: limit jobs) is what sampling cost, which ``EventBus.sample_share`` budgets
        self._plain_epoch_secs: float | None = None
        self.finalized_epoch: int | None = None
        self.stop_reason: str | None = None
        self._in_batch = threading.Event()
        self._batch_id: int | None = None
        # Whether an epoch may start and whether the query is being stopped are decided under one
        # lock, so a stop "between epochs" cannot interrupt an epoch that began a moment later.
        self._gate = threading.Lock()
        self._closing = False
        self.refused_epoch: int | None = None
        #: restarts after transient failures of the query itself (``PipelineRun``), counted since
        #: the epoch ``outage_epoch`` was the last one finalized
        self.outage_attempts = 0
        self.outage_epoch: int | None = None
        self._raw: dict[str, DataFrame] = {}
        self.counts = EpochCounts(flow, self.sources, self.sinks, bool(self.side_outputs))
        self._offsets: dict[str, Any] = {}
        self.checkpoint = FlowCheckpoint(self.settings, flow, self.sources, spark, state)

    # --- lifecycle --------------------------------------------------------------------------------

    @property
    def checkpoint_dir(self) -> str:
        """The Spark checkpoint of the current phase."""
        return self.checkpoint.checkpoint_dir

    def _input_frame(self) -> DataFrame:
        from pyspark.sql import functions as F

        frames = [s.read_stream(self.spark) for s in self.sources]
        if len(frames) == 1:
            return frames[0]
        tagged = []
        for i, df in enumerate(frames):
            cols = [F.lit(i).alias(SRC_TAG)] + [F.col(f"`{c}`").alias(f"__s{i}_{c}") for c in df.columns]
            tagged.append(df.select(*cols))
        out = tagged[0]
        for other in tagged[1:]:
            out = out.unionByName(other, allowMissingColumns=True)
        return out

    def _split(self, batch: DataFrame) -> dict[str, DataFrame]:
        """The epoch's raw rows of each source (the query reads all of a flow's sources at once)."""
        from pyspark.sql import functions as F

        if len(self.sources) == 1:
            return {self.sources[0].name: batch}
        out = {}
        for i, source in enumerate(self.sources):
            prefix = f"__s{i}_"
            cols = [F.col(f"`{c}`").alias(c[len(prefix):]) for c in batch.columns if c.startswith(prefix)]
            out[source.name] = batch.where(F.col(SRC_TAG) == i).select(*cols)
        return out

    def trigger(self) -> dict[str, Any]:
        if self.bounded:
            return {"availableNow": True}
        interval = float(self.settings.checkpoint_interval_sec)
        polls = [s.poll_interval_secs for s in self.sources if s.poll_interval_secs]
        if polls:
            interval = min([interval, *polls]) if interval > 0 else min(polls)
        return {"processingTime": f"{int(interval * 1000)} milliseconds"} if interval > 0 else {}

    def _enter_phase(self) -> None:
        """Point the flow at the checkpoint of its sources' current phase (hybrid: backfill, live)."""
        self.phase = "-".join(p for s in self.sources if (p := s.phase()))
        self.bounded = all(s.bounded for s in self.sources)
        self.checkpoint.enter_phase(self.phase)

    def next_phase(self) -> bool:
        """After a bounded query ended cleanly: True when a source moved to a further phase and the
        flow must be started again (``start``) on that phase's checkpoint."""
        self.await_finalized()
        if not any(s.next_phase() for s in self.sources):
            return False
        log.info("flow '%s': phase %s finished at epoch %s", self.flow.name, self.phase or "-", self.finalized_epoch)
        self.query = None
        self.last_epoch = self.finalized_epoch = None
        self._offsets = {}
        return True

    @property
    def epoch_token(self) -> str:
        """``sink_token`` of the current phase: epoch ids start over with each phase's checkpoint, so
        writers that remember the last epoch they wrote must not mistake a new phase's epochs for it."""
        token = self.checkpoint.sink_token
        return f"{token}:{self.phase}" if self.phase else token

    def start(self) -> None:
        self._enter_phase()
        self.checkpoint.check()
        for sink in self.sinks:
            try:
                call_with_retry(functools.partial(sink.open, self.spark), self.settings.retry,
                                f"opening {sink.ctx.spec.type} sink '{sink.name}'")
            except StreamlingError:
                raise
            except Exception as exc:
                raise sink.ctx.error(f"cannot prepare the sink: {java_message(exc)}", code="sink_open_failed",
                                     retriable=False) from exc
        stream = self._input_frame()
        writer = (stream.writeStream.foreachBatch(self._process)
                  .option("checkpointLocation", str(self.checkpoint_dir))
                  .queryName(f"{self.settings.application_id}:{self.flow.name}"))
        trigger = self.trigger()
        if trigger:  # none: the next epoch starts as soon as the last one ends
            writer = writer.trigger(**trigger)
        self.query = writer.start()
        self.counts.execution = None
        self.checkpoint.adopt()  # warned once; later restarts of this definition resume quietly
        self.bus.publish(ev.FlowStarted(self.flow.name, query_id=str(self.query.id),
                                        sources=[s.name for s in self.sources],
                                        sinks=[s.name for s in self.sinks], bounded=self.bounded))

    # --- the epoch --------------------------------------------------------------------------------

    def _process(self, batch: DataFrame, batch_id: int) -> None:
        with self._gate:
            if self._closing:
                self.refused_epoch = batch_id
                raise EpochNotStarted(f"flow '{self.flow.name}': epoch {batch_id} not started, the query is stopping")
            self._batch_id = batch_id
            self._in_batch.set()
        try:
            self._run_epoch(batch, batch_id)
        except Exception as exc:
            if self._closing and self.failure is not None:
                raise  # cut short by a stop past its budget: that verdict (``stopped``) stands
            if isinstance(exc, StreamlingError) and exc.code == STOPPED:
                # A stop request cut a retry short: not a failure of the data, nothing to explain.
                stopped = StreamlingError(
                    f"stop requested while retrying: epoch {batch_id} of flow '{self.flow.name}' was not committed; "
                    "it is replayed on the next start", node=exc.node, node_kind=exc.node_kind, code=STOPPED)
                stopped.__cause__ = exc
                self.failure = stopped
                log.info("flow '%s': epoch %d interrupted by the stop request", self.flow.name, batch_id)
                raise
            if isinstance(exc, StreamlingError):
                err = self._explain(exc) or exc
                node = err.node
            else:
                jvm = jvm_failure(exc)
                err = self._explain(exc) or StreamlingError(
                    f"flow '{self.flow.name}' failed in epoch {batch_id}: "
                    f"{jvm.what if jvm else java_message(exc)}", hint=jvm.hint if jvm else None,
                    user=False, code="jvm_failed" if jvm else "epoch_failed", cause=exc)
                node = None
            self.failure = err
            self.bus.publish(ev.PipelineError(self.flow.name, node=node, message=err.headline()))
            raise
        finally:
            self._in_batch.clear()

    def _explain(self, exc: BaseException) -> StreamlingError | None:
        """Name the node behind ``exc``: an executor-side operator that raised ``NodeFailure``, or a
        source whose input record caused it (a poison message)."""
        failure = node_failure_from_text(chain_text(exc))
        if failure is not None:
            failure.__cause__ = exc
            return failure
        for source in self.sources:
            raw = self._raw.get(source.name)
            if raw is None:
                continue
            try:
                found = source.explain_failure(raw, exc)
            except Exception:  # noqa: BLE001 - diagnosis is best effort; the original error stands
                log.debug("explaining the failure via %s failed", source.name, exc_info=True)
                continue
            if found is not None:
                found.__cause__ = exc
                return found
        return None

    def _run_epoch(self, batch: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        epoch = Epoch(epoch_id=batch_id, flow=self.flow.name, application_id=self.settings.application_id,
                      query_id=str(self.query.id) if self.query else "", sink_token=self.epoch_token,
                      started_at=time.time())
        self.bus.publish(ev.EpochPlanned(self.flow.name, epoch=batch_id))
        spark = batch.sparkSession
        # Cache the batch when it is read more than once: several sinks, side outputs, a dynamic
        # table collecting its values before the rest of the DAG runs, or an epoch whose rows are
        # sampled (notebook monitor; live inspect every refresh_in_secs) — a sample's ``limit`` job
        # must not re-run the source. The source is then scanned once.
        sampled = self.bus.wants_sample(self.flow.name)
        sample_secs = 0.0
        fan_out = (len(self.sinks) > 1 or bool(self.side_outputs) or sampled
                   or any(node.reads_batch_eagerly for node in self.plan.transforms(self.flow)))
        cached = [fan_out]
        if fan_out:
            batch = batch.persist()

        def on_retry(exc: BaseException, attempt: int, node: str | None = None) -> None:
            self._retry_event(exc, attempt, node)
            if batch_id not in self.counts.retried_input:
                self.counts.count_input(batch, batch_id, cached)

        self._raw = self._split(batch)
        rows: dict[str, int] = {}
        durations: dict[str, float] = {}
        try:
            # Transforms that reach out (a Postgres dynamic table) only classify their failures; the
            # flow retries the evaluation with the same policy as sink writes (it is idempotent).
            raw = self._raw
            watch: list[EpochObservations] = []
            # One source read once by the one sink's single job: Spark's scan metric is the exact
            # input count, so the input is not observed (an observation splits the generated code).
            spark_counts = (not cached[0] and self.query is not None and self.counts.scan_counts
                            and len(self.sources) == 1 and len(self.sinks) == 1 and self.sinks[0].reads_once)

            def dag() -> dict[str, DataFrame]:
                # a retried evaluation observes afresh
                watch[:] = [self.counts.observations(not spark_counts, epoch.started_at * 1000)]
                return evaluate(self.plan, self.flow, spark, raw, epoch, watch=watch[0])

            frames = call_with_retry(dag, self.settings.retry, f"flow '{self.flow.name}' epoch {batch_id} transforms",
                                     on_retry)
            durations["transforms"] = (time.perf_counter() - started) * 1000
            if self.side_outputs:
                call_with_retry(lambda: self.side_outputs.run({s.name: frames[s.name] for s in self.sources}),
                                self.settings.retry, f"flow '{self.flow.name}' epoch {batch_id} side outputs",
                                on_retry)
            for sink in self.sinks:
                spec = sink.ctx.spec
                inputs = [frames[u] for u in spec.upstream]
                df = inputs[0]
                for other in inputs[1:]:
                    df = df.unionByName(other, allowMissingColumns=True)
                df = expectations.guard(sink, df, watch[0] if watch else None)
                if not sink.counts_rows and watch:
                    df = watch[0].count(sink.name + RECEIVED, df, only_input(spec, frames))
                if watch and (event_time := event_time_extra(self.plan, watch[0], sink, df)):
                    df = watch[0].watch(sink.name + EVENT_TIME, df, event_time)
                t0 = time.perf_counter()
                rows[sink.name] = self._write(sink, sink.spread(df), epoch, on_retry)
                durations[sink.name] = (time.perf_counter() - t0) * 1000
            if watch:
                for node, sink_name in self.counts.by_sink.items():
                    watch[0].given[node] = {ROWS: rows[sink_name]}
            if spark_counts and watch:
                # a retried write read the batch again: the flow counted it once on the cached batch
                scanned = self.counts.retried_input.get(batch_id)
                if scanned is None:
                    scanned = self.counts.scanned_rows(self.query)
                if scanned is not None:
                    watch[0].given[self.sources[0].name + INPUT] = {ROWS: scanned}
            observed = watch[0].results() if watch else {}
            for sink in self.sinks:
                if not sink.counts_rows:
                    rows[sink.name] = int(observed.get(sink.name + RECEIVED, {}).get(ROWS) or 0)
            if all(s.name + INPUT in observed for s in self.sources):  # what the sources read, before decoding
                self.counts.observed_input[batch_id] = sum(int(observed[s.name + INPUT][ROWS]) for s in self.sources)
            # After the sinks: their jobs filled the observations; a sample's limited job must not.
            if sampled:
                t0 = time.perf_counter()
                publish_samples(self.bus, self.flow.name, epoch, frames, observed)
                sample_secs = time.perf_counter() - t0
        finally:
            if cached[0]:
                batch.unpersist()
        planned = self._planned_offsets(batch_id)
        for i, source in enumerate(self.sources):
            source.on_flushed(epoch, planned[i] if i < len(planned) else None)
        durations["total"] = (time.perf_counter() - started) * 1000
        seconds = durations["total"] / 1000
        if sampled:  # the limit jobs, or more when the epoch ran longer than a plain one (the cached batch)
            extra = seconds - self._plain_epoch_secs if self._plain_epoch_secs is not None else 0.0
            self.bus.sampled(self.flow.name, max(sample_secs, extra))
        else:
            self._plain_epoch_secs = seconds
        self.last_epoch = batch_id
        self.rows_to_sinks += max(rows.values(), default=0)
        self.bus.publish(ev.EpochFlushed(self.flow.name, epoch=batch_id, rows=rows, durations_ms=durations,
                                         node_rows={n: int(v[ROWS]) for n, v in observed.items()
                                                    if n in self.plan.nodes},
                                         event_time_ms=event_times(self.plan, observed),
                                         event_time_lag=_lags(observed),
                                         compute_ms={**(watch[0].compute_ms if watch else {}),
                                                     **{s.name: durations[s.name] for s in self.sinks}},
                                         expectations=expectation_results(self.plan, self.flow, observed)))
        limit = self.settings.num_records_before_stop
        if limit is not None and self.rows_to_sinks >= limit:
            self.request_stop(f"num_records_before_stop={limit} reached")
        if any(s.wants_stop() for s in self.sinks):
            self.request_stop("a print sink reached its num_records_before_stop")

    def _planned_offsets(self, batch_id: int) -> list[Any]:
        """The end offset of each source for ``batch_id``, from Spark's write-ahead log (written
        before the epoch runs); [] when the log cannot be read."""
        path = storage.join(self.checkpoint_dir, "offsets", str(batch_id))
        try:
            lines = self.checkpoint.store.read_text(path).splitlines()[2:]  # version, metadata, then sources
        except (OSError, StreamlingError):
            return []
        out: list[Any] = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append(None)
        return out

    def _retry_event(self, exc: BaseException, attempt: int, node: str | None = None) -> None:
        """Tell subscribers (CLI, widgets) that a node's transient failure is being retried; ``node``
        names it when the error does not (a plugin sink raising a plain ``ConnectionError``)."""
        if not isinstance(exc, StreamlingError):  # raised on an executor: the node's own words
            exc = node_failure_from_text(chain_text(exc)) or exc
        node = exc.node if isinstance(exc, StreamlingError) and exc.node else node
        message = exc.headline() if isinstance(exc, StreamlingError) else first_line(exc)
        self.bus.publish(ev.PipelineError(self.flow.name, node=node, message=message, retriable=True,
                                          attempt=attempt))

    def _write(self, sink: Sink, df: DataFrame, epoch: Epoch,
               on_retry: Callable[[BaseException, int, str | None], None] | None = None) -> int:
        notify = on_retry or self._retry_event
        return write_epoch(sink, df, epoch, self.settings.retry, lambda exc, attempt: notify(exc, attempt, sink.name))

    # --- finalization and stop --------------------------------------------------------------------

    def on_progress(self, progress: dict[str, Any]) -> None:
        """Spark committed an epoch (``commits/N``): publish it and copy offsets to state."""
        batch_id = int(progress.get("batchId", -1))
        self.finalized_epoch = batch_id
        offsets: dict[str, Any] = {}
        lag: dict[str, dict[str, int]] = {}
        for source, info in zip(self.sources, progress.get("sources") or [], strict=False):
            end = _json(info.get("endOffset"))
            offsets[source.name] = end
            behind = partition_lag(end, _json(info.get("latestOffset")))
            if behind is not None:
                lag[source.name] = behind
            if self.state is not None and end is not None and self._offsets.get(source.name) != end:
                now_ms = int(time.time() * 1000)
                entries = {key: {**data, "epoch": batch_id, "updated_at": now_ms}
                           for key, data in source.state_entries(end).items()}
                call_with_retry(functools.partial(self.state.put_many, entries), self.settings.retry,
                                f"copying epoch {batch_id} offsets of source '{source.name}' to the state backend")
                self._offsets[source.name] = end
        committed = Epoch(batch_id, self.flow.name, self.settings.application_id, sink_token=self.epoch_token)
        hooks: list[tuple[str, Callable[[], None]]] = [
            (f"source '{source.name}'", functools.partial(source.on_finalized, committed, offsets.get(source.name)))
            for source in self.sources]
        hooks += [(f"sink '{sink.name}'", functools.partial(sink.on_finalized, committed)) for sink in self.sinks]
        for who, hook in hooks:
            try:  # transient failures (a server briefly busy) get the flow's retry policy
                call_with_retry(hook, self.settings.retry, f"{who}: finalizing epoch {batch_id}")
            except Exception as exc:  # noqa: BLE001 - the epoch is committed; a failing hook cannot undo that
                log.error("%s: finalizing epoch %d failed: %s", who, batch_id,
                          exc.headline() if isinstance(exc, StreamlingError) else exc)
        self.bus.publish(ev.EpochFinalized(
            self.flow.name, epoch=batch_id, offsets=offsets,
            input_rows=self.counts.input_rows(batch_id, progress),
            durations_ms={k: float(v) for k, v in (progress.get("durationMs") or {}).items()},
            input_rows_per_second=float(progress.get("inputRowsPerSecond") or 0.0),
            processed_rows_per_second=float(progress.get("processedRowsPerSecond") or 0.0), lag=lag,
            progress=progress))

    def request_stop(self, reason: str) -> None:
        if self.stop_reason is None:
            self.stop_reason = reason
            log.info("flow '%s': stopping after the current epoch (%s)", self.flow.name, reason)

    def stop_when_idle(self, timeout_secs: float = 60.0) -> None:
        """Stop the query between epochs, so the epoch in flight finishes and commits.

        An epoch Spark starts after that decision is refused before any sink runs (``EpochNotStarted``);
        one still running after ``timeout_secs`` is interrupted and the flow fails with ``stopped``.
        """
        if self.query is None:
            return
        deadline = time.monotonic() + timeout_secs
        while self.query.isActive:
            with self._gate:
                if not self._in_batch.is_set() and not self._committing():
                    self._closing = True
                    break
            if time.monotonic() > deadline:
                log.warning("flow '%s': epoch still running after %.0fs, stopping anyway", self.flow.name,
                            timeout_secs)
                epoch = self._batch_id if self._in_batch.is_set() else self.last_epoch
                with self._gate:
                    if self.failure is None:  # the interrupted epoch's own error would only be a consequence
                        self.failure = StreamlingError(
                            f"stop requested, but epoch {epoch} of flow '{self.flow.name}' was still running after "
                            f"{timeout_secs:.0f}s: it was not committed; it is replayed on the next start",
                            code=STOPPED)
                    self._closing = True
                break
            time.sleep(0.05)
        self.query.stop()

    def interrupted_by_stop(self) -> bool:
        """Whether the query ended with an error that our own stop caused. Spark interrupts the
        query's thread on ``stop()``; an HDFS client interrupted while writing the next epoch's
        offsets reports it as an ``IOException`` ("Failed to shutdown streamer") that Spark does not
        take for an interruption. Nothing committed is lost: the epoch being planned is planned again
        on the next start, from the same checkpoint."""
        if not self._closing or self.query is None or self.query.isActive:
            return False
        exc = self.query.exception()
        return exc is not None and any(marker in chain_text(exc) for marker in _INTERRUPTED)

    def _committing(self) -> bool:
        """True between the end of our batch function and Spark's commit of that epoch."""
        if self.query is None or self.last_epoch is None:
            return False
        progress = self.query.lastProgress
        return progress is None or int(progress.get("batchId", -1)) < self.last_epoch

    def await_finalized(self, timeout_secs: float = 5.0) -> None:
        """Spark reports an epoch's commit asynchronously; let the last report arrive."""
        deadline = time.monotonic() + timeout_secs
        while (self.last_epoch is not None and (self.finalized_epoch is None or self.finalized_epoch < self.last_epoch)
               and time.monotonic() < deadline):
            time.sleep(0.05)

    def close(self) -> None:
        for source in self.sources:
            try:
                source.close()
            except Exception:  # noqa: BLE001
                log.exception("closing source '%s' failed", source.name)
        for sink in self.sinks:
            try:
                sink.close()
            except Exception:  # noqa: BLE001
                log.exception("closing sink '%s' failed", sink.name)


def write_epoch(sink: Sink, df: DataFrame, epoch: Epoch, policy: RetrySettings,
                on_retry: Callable[[BaseException, int], None] | None = None) -> int:
    """One sink's write of one epoch as the flow makes it: retried by ``policy`` while the sink
    classifies its failure as transient, and any failure raised as a ``StreamlingError`` naming the
    sink (an executor-side node's own error when one is in the chain). The sink contract tests
    every sink through this."""
    try:
        return call_with_retry(lambda: sink.write(df, epoch), policy,
                               f"{sink.ctx.spec.type} sink '{sink.name}' epoch {epoch.epoch_id}", on_retry)
    except StreamlingError:
        raise
    except Exception as exc:
        text = chain_text(exc)
        # an executor-side node said what failed, or executors could not start Python at all
        named = node_failure_from_text(text) or worker_failure(text)
        if named is not None:
            raise named from exc
        raise sink.ctx.error(f"writing epoch {epoch.epoch_id} failed: {java_message(exc)}",
                             user=False, code="sink_failed") from exc
