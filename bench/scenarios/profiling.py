"""Where the time goes: phase timers for in-process runs, cProfile digests for subprocesses.

A sampling profiler would see little of a streamling epoch from Python (the work is in the JVM and
in Python workers, the driver mostly waits on py4j), so in-process runs are split by wrapping the
runtime's own phase functions with wall-clock timers, and subprocesses (cold start) are run under
``cProfile`` to attribute the driver's main thread to session start, planning and waiting.
"""

from __future__ import annotations

import functools
import importlib
import pstats
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _resolve(target: str) -> tuple[Any, str]:
    """``"pkg.module:Class.method"`` or ``"pkg.module:function"`` → (owner object, attribute)."""
    module_name, _, attr_path = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *parents, attr = attr_path.split(".")
    for part in parents:
        owner = getattr(owner, part)
    return owner, attr


@contextmanager
def phase_timers(targets: Sequence[str]) -> Iterator[dict[str, list[float]]]:
    """Wrap each target with a timer for the duration of the block; yields label -> [ms per call].

    Targets that do not exist (a runtime refactor renamed them) are skipped, not fatal: the
    benchmark must keep producing its figures when the profile list goes stale.
    """
    timings: dict[str, list[float]] = {}
    patched: list[tuple[Any, str, Any]] = []
    for target in targets:
        try:
            owner, attr = _resolve(target)
            original = getattr(owner, attr)
        except (ImportError, AttributeError):
            continue
        label = target.split(":", 1)[1]
        setattr(owner, attr, _timed(original, timings.setdefault(label, [])))
        patched.append((owner, attr, original))
    try:
        yield timings
    finally:
        for owner, attr, original in reversed(patched):
            setattr(owner, attr, original)


def _timed(fn: Callable[..., Any], sink: list[float]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink.append(round((time.perf_counter() - t0) * 1000, 1))

    return wrapper


def summarize_timings(timings: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    """Calls, total and median ms per phase (the first call is often a one-off warm-up)."""
    return {label: {"calls": len(v), "total_ms": round(sum(v), 1), "median_ms": round(statistics.median(v), 1),
                    "first_ms": v[0]}
            for label, v in timings.items() if v}


def cprofile_phases(path: Path, phases: Sequence[tuple[str, str, str]]) -> dict[str, float]:
    """Cumulative seconds of chosen functions in a ``cProfile`` dump.

    ``phases`` holds (label, file path suffix, function name); the largest matching entry wins,
    which picks the outermost call when a name recurs.
    """
    stats = pstats.Stats(str(path)).stats  # type: ignore[attr-defined]
    out: dict[str, float] = {}
    for label, file_suffix, func in phases:
        best = 0.0
        for (filename, _line, name), (_cc, _nc, _tt, cumulative, _callers) in stats.items():
            if name == func and filename.endswith(file_suffix):
                best = max(best, float(cumulative))
        out[label] = round(best, 3)
    return out
