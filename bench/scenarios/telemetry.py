"""``telemetry``: what operating a run costs, and what the notebook monitor's counting costs.

generate (6M rows, 500k-row epochs) → the blackhole SQL → blackhole, in-process:
- ``off``: no telemetry (a bare ``PipelineRun``);
- ``on``: what the CLI attaches — run stats, the OpenTelemetry metrics with their Prometheus
  registry and the admin API on a free port;
- ``on + live inspect``: the same with live inspect sampling every node every ``refresh_in_secs``
  (Streamling's default 30 s: the run's first epoch and every 30 s after);
- ``monitor``: a notebook run's settings: 20 rows sampled per node, samples held to 5 % of the run's
  time (the first epoch, then as often as that allows), node counts from the sinks' own jobs;
- ``monitor, every epoch``: the same sampling every epoch (the notebook's setting before the share);
- ``monitor, count jobs``: sampling every epoch with the counting observations replaced, one
  ``count()`` job per transform per epoch, reproduced here to measure the difference;
- ``event time``: ``telemetry.event_time`` on the source's and the sink's ``created_at`` (per-row
  lag histogram and watermark, computed by Spark in each node's observation), no other telemetry.
"""

from __future__ import annotations

from typing import Any

from scenarios.common import (
    Options,
    ScenarioResult,
    Side,
    interleaved,
    log,
    paired_ratio,
    session_facts,
    shared_session,
    temp_dir,
)
from scenarios.inprocess import generate_yaml, run_streamling
from streamling.util import free_port

NAME = "telemetry"
SQL = "SELECT id, customer, amount * quantity AS total, _gs_op FROM orders WHERE amount > 100"
DEFAULT_ROWS = 6_000_000


def _with_count_jobs(fn: Any) -> Any:
    """Run ``fn`` with the flow's sampling also counting every transform with its own job (the
    monitor's counting before observations)."""
    from streamling.runtime import flow as flow_module

    original = flow_module.FlowRunner._sample

    def counting(self: Any, epoch: Any, frames: Any, observed: Any) -> None:
        sources = {s.name for s in self.sources}
        for name, df in frames.items():
            if name not in sources:
                df.count()
        original(self, epoch, frames, observed)

    def run() -> dict[str, Any]:
        flow_module.FlowRunner._sample = counting  # type: ignore[method-assign]
        try:
            return fn()  # type: ignore[no-any-return]
        finally:
            flow_module.FlowRunner._sample = original  # type: ignore[method-assign]

    return run


def run(opts: Options) -> ScenarioResult:
    rows = opts.rows or DEFAULT_ROWS
    spark = shared_session()
    source = {"rows": rows, "rows_per_batch": min(500_000, rows), "partitions": 2, "profile": "orders"}
    yaml_text = generate_yaml(source, SQL, {"type": "blackhole"})
    event_time = {"telemetry": {"event_time": {"column": "created_at"}}}
    timed_yaml = generate_yaml({**source, **event_time}, SQL.replace("SELECT id,", "SELECT id, created_at,"),
                               {"type": "blackhole", **event_time})

    def side(name: str, text: str = yaml_text, **kwargs: Any) -> Any:
        def go() -> dict[str, Any]:
            with temp_dir(f"telemetry-{name.split()[0]}") as workdir:
                return run_streamling(spark, text, workdir, rows, **kwargs)
        return go

    runs = {
        "off": side("off", admin_api_port=0),
        "on": side("on", telemetry=True, admin_api_port=free_port()),
        "on + live inspect": side("on-inspect", telemetry=True, admin_api_port=free_port(),
                                  live_data_inspect_enabled=True),
        "monitor": side("monitor", sample_rows=20, sample_share=0.05, admin_api_port=0),
        "monitor, every epoch": side("monitor-every", sample_rows=20, admin_api_port=0),
        "monitor, count jobs": _with_count_jobs(side("monitor-count", sample_rows=20, admin_api_port=0)),
        "event time": side("event-time", timed_yaml, admin_api_port=0),
    }

    sides = {name: Side(name) for name in runs}
    log(f"{NAME}: {rows:,} rows, {opts.runs} runs")
    interleaved(opts.runs, runs, sides, log)
    result = ScenarioResult(NAME, {"rows": rows, "sql": SQL, "spark": session_facts(spark)}, sides)
    result.figures = {f"{name} rows/s": (s.median("rows_per_s"), "rows/s") for name, s in sides.items()}
    for name, s in sides.items():
        epochs = [ms for r in s.runs for ms in r["epoch_ms"][1:]]
        if epochs:
            epochs.sort()
            result.figures[f"{name} median epoch (1st excluded)"] = (epochs[len(epochs) // 2], "ms")
    off = sides["off"]
    result.ratios = {"on / off (paired per round)": paired_ratio(sides["on"], off, "rows_per_s"),
                     "on + live inspect / off (paired)": paired_ratio(sides["on + live inspect"], off, "rows_per_s"),
                     "monitor / off (paired)": paired_ratio(sides["monitor"], off, "rows_per_s"),
                     "monitor, every epoch / off (paired)": paired_ratio(sides["monitor, every epoch"], off,
                                                                         "rows_per_s"),
                     "monitor, count jobs / off (paired)": paired_ratio(sides["monitor, count jobs"], off,
                                                                        "rows_per_s"),
                     "event time / off (paired)": paired_ratio(sides["event time"], off, "rows_per_s")}
    return result
