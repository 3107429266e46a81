"""What every scenario shares: machine facts, load sampling, medians, settings and the session.

Benchmarks on a small shared machine are noisy, so every figure carries the load average seen
around it, runs are interleaved streamling / hand-written (ABBA) so drift hits both sides, and
only medians are compared.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from streamling.config import Settings

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "bench" / "results"
VENV_BIN = ROOT / ".venv" / "bin"


def ensure_services(*names: str, present: tuple[str, ...]) -> str | None:
    """Make the exports of ``fixtures/services/up NAMES`` visible to this process, unless the
    variables ``present`` are already set; returns why not, if impossible."""
    import shlex

    if all(os.environ.get(var) for var in present):
        return None
    up = ROOT / "fixtures" / "services" / "up"
    if not up.exists():
        return f"{up.relative_to(ROOT)} is missing"
    proc = subprocess.run([str(up), *names], capture_output=True, text=True, cwd=ROOT, timeout=900)
    if proc.returncode != 0:
        return f"fixtures/services/up {' '.join(names)} failed: {proc.stderr.strip()[-500:]}"
    for line in proc.stdout.splitlines():
        parts = shlex.split(line)
        if len(parts) == 2 and parts[0] == "export" and "=" in parts[1]:
            key, value = parts[1].split("=", 1)
            os.environ[key] = value
    return None


def ensure_cache_dir() -> None:
    """Jars and services live in the repo's ignored cache unless the caller chose another one."""
    os.environ.setdefault("STREAMLING_CACHE_DIR", str(ROOT / ".cache"))


def load_avg() -> tuple[float, float, float]:
    """1/5/15-minute load: another job on a 2-core box changes every figure, so keep it beside them."""
    one, five, fifteen = os.getloadavg()
    return round(one, 2), round(five, 2), round(fifteen, 2)


def _run_text(cmd: list[str]) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (proc.stdout + proc.stderr).strip()


def machine_facts() -> dict[str, Any]:
    """Enough context to tell whether two result files are comparable at all."""
    import pyspark

    import streamling

    mem_kib = 0
    try:
        meminfo = Path("/proc/meminfo").read_text()
        match = re.search(r"MemTotal:\s+(\d+)", meminfo)
        mem_kib = int(match.group(1)) if match else 0
    except OSError:
        pass
    java = _run_text(["java", "-version"]).splitlines()
    status = _run_text(["git", "status", "--porcelain", "--untracked-files=no"])
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kib / 1024 / 1024, 1),
        "load_avg": load_avg(),
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "java": java[0] if java else "",
        "git_commit": _run_text(["git", "rev-parse", "HEAD"]),
        "git_dirty": bool(status),
        # which streamling was measured: the editable checkout, or a snapshot put first on PYTHONPATH
        "streamling_path": str(Path(streamling.__file__).parent),
    }


@dataclass
class Side:
    """All measured runs of one side (streamling or the hand-written job) of a scenario."""

    name: str
    runs: list[dict[str, Any]] = field(default_factory=list)
    warmup: dict[str, Any] | None = None

    def median(self, key: str) -> float:
        values = [float(r[key]) for r in self.runs if r.get(key) is not None]
        return statistics.median(values) if values else float("nan")


def paired_ratio(ours: Side, theirs: Side, key: str, higher_is_better: bool = True) -> float:
    """Median over rounds of the per-round ratio (streamling run vs the hand-written run next to it).

    Runs of one round are seconds apart, so a load swing from a neighbour hits both; the median
    of per-round ratios is steadier than the ratio of two medians taken at different moments.
    Oriented like every ratio here: higher is better for streamling, 1.0 is parity.
    """
    ratios = []
    for a, b in zip(ours.runs, theirs.runs, strict=False):
        x, y = a.get(key), b.get(key)
        if x and y:
            ratios.append(float(x) / float(y) if higher_is_better else float(y) / float(x))
    return statistics.median(ratios) if ratios else float("nan")


@dataclass
class ScenarioResult:
    """What a scenario returns: both sides, the figures to print, and free-form notes."""

    scenario: str
    params: dict[str, Any]
    sides: dict[str, Side]
    #: headline figures: name -> (value, unit); printed as the table and stored in the JSON.
    figures: dict[str, tuple[float, str]] = field(default_factory=dict)
    #: streamling / hand-written, oriented so that higher is better for streamling (goal >= 0.9).
    ratios: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "params": self.params,
            "figures": {k: {"value": v, "unit": u} for k, (v, u) in self.figures.items()},
            "ratios": self.ratios,
            "notes": self.notes,
            "skipped": self.skipped,
            "sides": {k: asdict(v) for k, v in self.sides.items()},
        }


@dataclass(frozen=True)
class Options:
    """Command-line knobs every scenario understands."""

    runs: int = 3
    rows: int | None = None
    profile: bool = False


def interleaved(runs: int, sides: Mapping[str, Callable[[], dict[str, Any]]],
                results: Mapping[str, Side], log: Callable[[str], None]) -> None:
    """One warm-up per side, then ``runs`` measured rounds in ABBA order.

    Alternating which side goes first cancels slow drifts (JIT, page cache, a neighbour's tests
    starting) that would otherwise always favour the side that runs second.
    """
    names = list(sides)
    for name in names:
        log(f"  warm-up {name}")
        results[name].warmup = _with_load(sides[name])
    for i in range(runs):
        order = names if i % 2 == 0 else list(reversed(names))
        for name in order:
            run = _with_load(sides[name])
            results[name].runs.append(run)
            log(f"  run {i + 1}/{runs} {name}: " + ", ".join(
                f"{k}={v:.3f}" for k, v in run.items() if isinstance(v, float) and not k.startswith("load")))


def _with_load(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    before = load_avg()
    out = fn()
    out["load_before"] = before[0]
    out["load_after"] = load_avg()[0]
    return out


@contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    """A fresh directory per run (checkpoints, state), removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=f"streamling-bench-{prefix}-") as path:
        yield Path(path)


def bench_settings(workdir: Path, application_id: str, **overrides: Any) -> Settings:
    """Settings for an in-process run: the user's STREAMLING__ environment (e.g. Postgres exports)
    plus a private state dir; no config file is picked up from the caller's directory."""
    from streamling.config import load_settings

    base: dict[str, Any] = {"state_dir": str(workdir / "state"), "application_id": application_id,
                            "checkpoint_interval_sec": 0}
    base.update(overrides)
    return load_settings(environ=os.environ, cwd=workdir, overrides=base)


_SESSION: SparkSession | None = None


def shared_session() -> SparkSession:
    """The one SparkSession both sides of every in-process scenario run on (streamling's own
    ``build_session``), so Spark conf, jars and shuffle partitions are identical by construction."""
    global _SESSION
    if _SESSION is None:
        from streamling.runtime.session import build_session

        with temp_dir("session") as workdir:
            settings = bench_settings(workdir, "bench_session")
        _SESSION = build_session(settings, app_name="streamling-bench")
    return _SESSION


def session_facts(spark: SparkSession) -> dict[str, str]:
    conf = spark.sparkContext.getConf()
    keys = ("spark.master", "spark.sql.shuffle.partitions", "spark.sql.execution.arrow.pyspark.enabled",
            "spark.driver.memory")
    return {k: conf.get(k, "") or "" for k in keys} | {"default_parallelism":
                                                     str(spark.sparkContext.defaultParallelism)}


def log(message: str) -> None:
    """Progress goes to stderr; stdout is kept for the result table."""
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
