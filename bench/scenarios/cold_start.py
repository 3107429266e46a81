"""``cold_start``: how long a user waits for the first row from a fresh ``streamling`` process.

The headline is the README's main command itself (``streamling pipeline.yaml`` on the repository's
``pipeline.yaml`` as shipped: generate → SQL → print + Delta upsert) measured as a multiple of the
**floor**: ``floor_job.py``, a fresh Python process doing a bare ``SparkSession.builder.getOrCreate()``
and one tiny job — no Spark program prints a row sooner on the same machine. Both run interleaved
with the comparison below, so every multiple is taken at the same load.

The comparison with a hand-written job also launches ``.venv/bin/streamling pipeline.yaml`` (fresh
process, fresh ``STREAMLING__STATE_DIR``), for a tiny generate → SQL → print pipeline, and times the
first print-sink line on stdout and the process exit. The hand-written side is ``handwritten_print.py``
run by the same interpreter, once with the very Spark conf streamling sets (jars, Delta extension)
and once with a minimal session, so a gap can be split into "session conf" and "streamling's own
start-up" (imports, planning).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Any

from scenarios.common import (
    ROOT,
    VENV_BIN,
    Options,
    ScenarioResult,
    Side,
    interleaved,
    log,
    paired_ratio,
    temp_dir,
)
from scenarios.profiling import cprofile_phases

NAME = "cold_start"
SQL = "SELECT id, customer, amount * quantity AS total, _gs_op FROM orders WHERE amount > 990"
DEFAULT_ROWS = 1000
TIMEOUT_SECS = 300
HANDWRITTEN = Path(__file__).with_name("handwritten_print.py")
FLOOR = Path(__file__).with_name("floor_job.py")
README_PIPELINE = ROOT / "pipeline.yaml"
#: the CLI's log line written once settings and the pipeline are loaded, before the SparkSession.
#: (label, file suffix, function) read from the cProfile dumps of ``--profile`` runs.
STREAMLING_PHASES = (
    ("cli main (all)", "streamling/cli.py", "main"),
    ("build_session", "streamling/runtime/session.py", "build_session"),
    ("PipelineRun.start", "streamling/runtime/pipeline.py", "start"),
    ("  analyze (schemas on empty batches)", "streamling/runtime/planner.py", "analyze"),
    ("    generate_stream", "streamling/sources/generate.py", "generate_stream"),
    ("    DataStreamReader.load", "pyspark/sql/streaming/readwriter.py", "load"),
    ("    createDataFrame", "pyspark/sql/session.py", "createDataFrame"),
    ("    SqlTransform.apply", "streamling/transforms/sql.py", "apply"),
    ("  FlowRunner.start", "streamling/runtime/flow.py", "start"),
    ("    DataStreamWriter.start", "pyspark/sql/streaming/readwriter.py", "start"),
    ("PipelineRun.wait", "streamling/runtime/pipeline.py", "wait"),
    ("PipelineRun.stop", "streamling/runtime/pipeline.py", "stop"),
)
HANDWRITTEN_PHASES = (
    ("main (all)", "handwritten_print.py", "main"),
    ("SparkSession getOrCreate", "pyspark/sql/session.py", "getOrCreate"),
    ("generate_stream", "streamling/sources/generate.py", "generate_stream"),
    ("DataStreamReader.load", "pyspark/sql/streaming/readwriter.py", "load"),
    ("DataStreamWriter.start", "pyspark/sql/streaming/readwriter.py", "start"),
    ("awaitTermination", "pyspark/sql/streaming/query.py", "awaitTermination"),
)
_READY = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO streamling: starting pipeline")


#: #9's goals for the README command, as multiples of the floor (lower is better).
FIRST_ROW_GOAL, EXIT_GOAL = 1.5, 2.0


def multiple(ours: Side, floor: Side, key: str) -> dict[str, float]:
    """``ours`` as a multiple of the floor, per round (runs of a round are seconds apart, so a
    neighbour's load hits both): median, min and max over rounds."""
    per_round = [float(a[key]) / float(b[key]) for a, b in zip(ours.runs, floor.runs, strict=False)
                 if a.get(key) and b.get(key)]
    if not per_round:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": statistics.median(per_round), "min": min(per_round), "max": max(per_round)}


def pipeline_yaml(rows: int) -> str:
    return (f"sources:\n  orders:\n    type: generate\n    rows: {rows}\n    rows_per_batch: {rows}\n"
            f"    partitions: 1\n    primary_key: id\n"
            f"transforms:\n  large:\n    type: sql\n    sql: {SQL}\n"
            f"sinks:\n  console:\n    type: print\n    from: large\n")


def time_process(cmd: list[str], cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    """Launch, stamp the first stdout line and the exit; stderr is kept for the phase breakdown."""
    stderr_path = cwd / "stderr.txt"
    with stderr_path.open("wb") as err:
        wall0 = time.time()
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err)
        timer = threading.Timer(TIMEOUT_SECS, proc.kill)
        timer.start()
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            t_first = time.perf_counter()
            lines = 1 if first else 0
            for _line in proc.stdout:
                lines += 1
            code = proc.wait()
            t_exit = time.perf_counter()
        finally:
            timer.cancel()
    stderr = stderr_path.read_text(errors="replace")
    if code != 0 or not first:
        raise RuntimeError(f"{cmd[0]} exited {code} with {lines} stdout lines:\n{stderr[-3000:]}")
    out: dict[str, Any] = {"first_row_s": t_first - t0, "exit_s": t_exit - t0, "rows_printed": lines}
    for line in stderr.splitlines():
        match = _READY.match(line)
        if match:
            stamp = dt.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out["cli_ready_s"] = stamp - wall0
            break
    return out


def _session_args() -> list[str]:
    """The jars and log4j file streamling's ``build_session`` passes, for the same-conf script."""
    from streamling.runtime import class_archive
    from streamling.runtime.jars import driver_jars, ensure_jars

    log4j = Path(str(resources.files("streamling.runtime").joinpath("log4j2.properties")))
    jars = driver_jars()
    class_archive.build(jars)  # streamling starts from it: so does the same-conf job
    return ["--same-conf", "--jars", ",".join(str(j) for j in ensure_jars()), "--log4j", str(log4j),
            "--java-options", class_archive.java_options(jars), *_source_args()]


def _source_args() -> list[str]:
    """The generate source's JVM reader, which both hand-written modes load: the same source as streamling."""
    from streamling.runtime.jars import native_jar

    jar = native_jar()
    return ["--source-jar", str(jar)] if jar is not None else []


def run(opts: Options) -> ScenarioResult:
    rows = opts.rows or DEFAULT_ROWS
    env = dict(os.environ)
    env.setdefault("STREAMLING_CACHE_DIR", str(ROOT / ".cache"))
    same_conf = _session_args()

    def streamling_side() -> dict[str, Any]:
        with temp_dir("cold") as workdir:
            (workdir / "pipeline.yaml").write_text(pipeline_yaml(rows))
            run_env = env | {"STREAMLING__STATE_DIR": str(workdir / "state")}
            return time_process([str(VENV_BIN / "streamling"), "pipeline.yaml"], workdir, run_env)

    def handwritten(extra: list[str]) -> dict[str, Any]:
        with temp_dir("cold-hw") as workdir:
            cmd = [sys.executable, str(HANDWRITTEN), "--rows", str(rows), "--rows-per-batch", str(rows),
                   "--partitions", "1", "--sql", SQL, "--checkpoint", str(workdir / "checkpoint"), *extra]
            return time_process(cmd, workdir, env)

    def readme_side() -> dict[str, Any]:
        with temp_dir("cold-readme") as workdir:
            shutil.copy(README_PIPELINE, workdir / "pipeline.yaml")  # its Delta path is relative: ./output
            run_env = env | {"STREAMLING__STATE_DIR": str(workdir / "state")}
            return time_process([str(VENV_BIN / "streamling"), "pipeline.yaml"], workdir, run_env)

    def floor_side() -> dict[str, Any]:
        with temp_dir("cold-floor") as workdir:
            return time_process([sys.executable, str(FLOOR)], workdir, env)

    names = ("readme", "floor", "streamling", "handwritten", "handwritten_minimal")
    sides = {n: Side(n) for n in names}
    log(f"{NAME}: README pipeline and floor; generate→SQL→print with {rows:,} rows; {opts.runs} runs")
    interleaved(opts.runs, {"readme": readme_side, "floor": floor_side, "streamling": streamling_side,
                            "handwritten": lambda: handwritten(same_conf),
                            "handwritten_minimal": lambda: handwritten(_source_args())}, sides, log)
    result = ScenarioResult(NAME, {"rows": rows, "sql": SQL, "python": sys.executable,
                                   "readme_pipeline": README_PIPELINE.read_text()}, sides)
    sl, hw, hm = sides["streamling"], sides["handwritten"], sides["handwritten_minimal"]
    rd, fl = sides["readme"], sides["floor"]
    first_x, exit_x = multiple(rd, fl, "first_row_s"), multiple(rd, fl, "exit_s")
    result.params["readme_vs_floor"] = {"first_row": first_x, "exit": exit_x,
                                        "goal": {"first_row": FIRST_ROW_GOAL, "exit": EXIT_GOAL}}
    result.figures = {
        "README command first row": (rd.median("first_row_s"), "s"),
        "README command exit": (rd.median("exit_s"), "s"),
        "floor (bare session + one job) result": (fl.median("first_row_s"), "s"),
        "floor exit": (fl.median("exit_s"), "s"),
        "streamling first row": (sl.median("first_row_s"), "s"),
        "hand-written first row": (hw.median("first_row_s"), "s"),
        "hand-written (minimal conf) first row": (hm.median("first_row_s"), "s"),
        "streamling exit": (sl.median("exit_s"), "s"),
        "hand-written exit": (hw.median("exit_s"), "s"),
        "hand-written (minimal conf) exit": (hm.median("exit_s"), "s"),
        "streamling CLI ready (before SparkSession)": (sl.median("cli_ready_s"), "s"),
    }
    result.notes += [
        f"README first row = {first_x['median']:.2f}x floor (per round {first_x['min']:.2f}-{first_x['max']:.2f}; "
        f"goal <= {FIRST_ROW_GOAL})",
        f"README exit = {exit_x['median']:.2f}x floor (per round {exit_x['min']:.2f}-{exit_x['max']:.2f}; "
        f"goal <= {EXIT_GOAL})",
    ]
    # Time ratios are inverted (hand-written / streamling) so that, like throughput, higher is
    # better for streamling and 1.0 means parity.
    result.ratios = {
        "first_row": hw.median("first_row_s") / sl.median("first_row_s"),
        "first_row (paired per round)": paired_ratio(sl, hw, "first_row_s", higher_is_better=False),
        "exit": hw.median("exit_s") / sl.median("exit_s"),
        "exit (paired per round)": paired_ratio(sl, hw, "exit_s", higher_is_better=False),
        "first_row_vs_minimal_conf": hm.median("first_row_s") / sl.median("first_row_s"),
        "exit_vs_minimal_conf": hm.median("exit_s") / sl.median("exit_s"),
    }
    if opts.profile:
        log("  profile runs (cProfile of each driver's main thread)")
        with temp_dir("cold-prof") as workdir:
            (workdir / "pipeline.yaml").write_text(pipeline_yaml(rows))
            prof = workdir / "streamling.prof"
            time_process([sys.executable, "-m", "cProfile", "-o", str(prof), str(VENV_BIN / "streamling"),
                          "pipeline.yaml"], workdir, env | {"STREAMLING__STATE_DIR": str(workdir / "state")})
            sl_phases = cprofile_phases(prof, STREAMLING_PHASES)
            prof_hw = workdir / "handwritten.prof"
            time_process([sys.executable, "-m", "cProfile", "-o", str(prof_hw), str(HANDWRITTEN), "--rows", str(rows),
                          "--rows-per-batch", str(rows), "--partitions", "1", "--sql", SQL,
                          "--checkpoint", str(workdir / "checkpoint"), *same_conf], workdir, env)
            hw_phases = cprofile_phases(prof_hw, HANDWRITTEN_PHASES)
        result.params["profile"] = {"streamling": sl_phases, "handwritten": hw_phases}
        result.notes += [f"profile streamling {k}: {v:.2f} s" for k, v in sl_phases.items()]
        result.notes += [f"profile hand-written {k}: {v:.2f} s" for k, v in hw_phases.items()]
    return result
