"""Plugin instances a process keeps between tasks, so a Python worker reuses them epoch after epoch.

Spark reuses a Python worker for the tasks it runs one after another, and an epoch's task for a
partition often lands on a worker that wrote the same partition before. A sink plugin's constructor
opens connections and clients; building it per epoch costs every epoch that. ``lease`` hands back
the instance a worker kept for the same key, or a new one, and keeps it after the task again:

- **only after success**: an instance whose hook raised, or whose task did not get to the end of its
  epoch, is closed and dropped, never handed out again: a retried or replayed epoch gets a fresh one
  (it may hold half an epoch's rows, or a broken connection);
- **checked out while in use**: two tasks of one key in one process never share an instance;
- **one version per family**: a key is ``(family, version)`` (e.g. a sink's job and partition, and
  the checkpoint's sink token); an instance of a newer version closes the family's older ones;
- **bounded**: beyond ``capacity`` kept instances the least recently used is closed;
- **closed at exit, best effort**: an ``atexit`` hook closes what is kept, but Spark's daemon ends
  its workers with ``os._exit`` or a kill, which skips it: what ``close`` does at exit must not be
  needed for correctness (durability belongs to the epoch hooks);
- **not across a fork**: a child process starts with nothing kept (the parent's connections are
  the parent's).

No pyspark here: executors, the testing kit and unit tests use it alike.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
#: how many sink instances one Python worker keeps between epochs, over every node and partition
EXECUTOR_CAPACITY = 16


def close_quietly(instance: Any) -> None:
    """``instance.close()``; a failure is logged, not raised: it must not hide the error that
    dropped the instance, nor fail another partition's task that happened to evict it."""
    try:
        instance.close()
    except Exception as exc:  # noqa: BLE001 - closing is best effort
        ctx = getattr(instance, "ctx", None)
        what = (f"{getattr(ctx, 'plugin_id', '')} '{getattr(ctx, 'node', '')}' partition "
                f"{getattr(ctx, 'partition', -1)}" if ctx is not None else type(instance).__name__)
        log.warning("closing %s failed: %s: %s", what, type(exc).__name__, exc)


class InstanceCache(Generic[T]):
    """Instances kept between uses, by ``(family, version)`` key, least recently used first."""

    def __init__(self, capacity: int, close: Callable[[T], None] = close_quietly) -> None:
        self.capacity = capacity
        self._close = close
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[Hashable, Hashable], T] = OrderedDict()
        self._pid = os.getpid()

    def __len__(self) -> int:
        with self._lock:
            return len(self._kept)

    def keys(self) -> list[tuple[Hashable, Hashable]]:
        with self._lock:
            return list(self._kept)

    @contextmanager
    def lease(self, family: Hashable, version: Hashable, create: Callable[[], T]) -> Iterator[T]:
        """The instance kept for ``(family, version)``, or ``create()``'s; kept again when the block
        ends normally, closed when it raises (or its generator is closed before the end)."""
        key = (family, version)
        with self._lock:
            self._forget_if_forked()
            instance = self._kept.pop(key, None)
            stale = [k for k in self._kept if k[0] == family and k[1] != version] if instance is None else []
            older = [self._kept.pop(k) for k in stale]
        for old in older:
            self._close(old)
        if instance is None:
            instance = create()
        try:
            yield instance
        except BaseException:
            self._close(instance)
            raise
        self._keep(key, instance)

    def _keep(self, key: tuple[Hashable, Hashable], instance: T) -> None:
        with self._lock:
            self._forget_if_forked()
            evicted = []
            if key in self._kept:  # another task of the key finished meanwhile: keep one of the two
                evicted.append(self._kept.pop(key))
            self._kept[key] = instance
            while len(self._kept) > self.capacity:
                evicted.append(self._kept.popitem(last=False)[1])
        for old in evicted:
            self._close(old)

    def close_all(self) -> None:
        """Close everything kept (at exit, or when the owner is done)."""
        with self._lock:
            self._forget_if_forked()
            kept = list(self._kept.values())
            self._kept.clear()
        for instance in kept:
            self._close(instance)

    def _forget_if_forked(self) -> None:
        if self._pid != os.getpid():  # a forked child: the instances (and their sockets) are the parent's
            self._kept.clear()
            self._pid = os.getpid()


#: the executor-side sink instances of this process (a Spark Python worker)
EXECUTOR_SINKS: InstanceCache[Any] = InstanceCache(EXECUTOR_CAPACITY)
atexit.register(EXECUTOR_SINKS.close_all)
