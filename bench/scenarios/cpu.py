"""CPU time of this process tree (the Python driver, the JVM it launched, Python workers) from /proc.

Wall time on a shared 2-core machine says how long a neighbour let us run; CPU time says what the
work cost. Spark's JVM is a child of the driver (py4j launches it), and Python workers are forked
by the JVM's ``pyspark.daemon``, so the driver's descendants are exactly what a run pays for; the
Kafka broker and the schema registry are started elsewhere and are not part of the tree.

Each process counts its own user+system time plus ``cutime``/``cstime`` (children it already
reaped), so a worker that exits between two snapshots is still counted: before, its own time;
after, its whole life through its parent. The difference of two snapshots is the tree's CPU spent
in between, at the kernel's clock-tick resolution (10 ms).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_TICK = float(os.sysconf("SC_CLK_TCK"))


@dataclass(frozen=True)
class CpuSnapshot:
    """Cumulative CPU seconds of the driver, the JVM and the JVM's descendants (Python workers)."""

    driver_s: float
    jvm_s: float
    workers_s: float

    @property
    def total_s(self) -> float:
        return self.driver_s + self.jvm_s + self.workers_s

    def __sub__(self, other: CpuSnapshot) -> CpuSnapshot:
        return CpuSnapshot(self.driver_s - other.driver_s, self.jvm_s - other.jvm_s,
                           self.workers_s - other.workers_s)


def _stat(pid: int) -> tuple[int, float, float] | None:
    """(ppid, own cpu seconds, reaped children's cpu seconds) of one process, None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: split after the last ')'.
    fields = text.rsplit(")", 1)[1].split()
    ppid = int(fields[1])
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return ppid, (utime + stime) / _TICK, (cutime + cstime) / _TICK


def _descendants(root: int, table: dict[int, tuple[int, float, float]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _own, _reaped) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        for child in children.get(pid, []):
            out.append(child)
            todo.append(child)
    return out


def snapshot(jvm_pid: int | None, driver_pid: int | None = None) -> CpuSnapshot:
    """CPU seconds so far of the driver (and its non-JVM children), the JVM, and the JVM's children."""
    driver = driver_pid or os.getpid()
    table: dict[int, tuple[int, float, float]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                table[int(entry.name)] = stat

    def cost(pid: int) -> float:
        _ppid, own, reaped = table.get(pid, (0, 0.0, 0.0))
        return own + reaped

    tree = {driver, *_descendants(driver, table)}
    if jvm_pid is None or jvm_pid not in table:
        return CpuSnapshot(driver_s=sum(cost(p) for p in tree), jvm_s=0.0, workers_s=0.0)
    _ppid, jvm_own, jvm_reaped = table[jvm_pid]
    workers = _descendants(jvm_pid, table)
    # The JVM's reaped children were Python workers: they count with the workers, not the JVM.
    workers_s = jvm_reaped + sum(cost(p) for p in workers)
    driver_s = sum(cost(p) for p in tree - {jvm_pid, *workers})
    return CpuSnapshot(driver_s=driver_s, jvm_s=jvm_own, workers_s=workers_s)


def jvm_pid_of(spark: object) -> int | None:
    """The pid of the session's JVM: the process py4j launched (``spark-submit`` execs ``java``)."""
    try:
        pid = int(spark.sparkContext._gateway.proc.pid)  # type: ignore[attr-defined]
    except (AttributeError, TypeError, ValueError):
        return None
    return pid if Path(f"/proc/{pid}").exists() else None
