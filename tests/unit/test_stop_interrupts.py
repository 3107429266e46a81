"""A query that our own stop interrupts is a clean stop, not a failed flow: Spark interrupts the
query's thread, and an HDFS client cut off while writing the next epoch's offsets reports it as an
``IOException`` that Spark does not take for an interruption (a hot redeploy failed on it)."""

from __future__ import annotations

from typing import Any

from streamling.runtime.flow import FlowRunner

HDFS_CUT = ("java.io.IOException: Failed to shutdown streamer\n"
            "\tat org.apache.hadoop.hdfs.DataStreamer.closeThreads(DataStreamer.java:1020)\n"
            "Caused by: java.lang.InterruptedException\n\tat java.base/java.lang.Object.wait(Native Method)")


class _Ended:
    isActive = False

    def __init__(self, exc: BaseException) -> None:
        self._exc = exc

    def exception(self) -> BaseException:
        return self._exc


def _runner(closing: bool, message: str, trace: str = "") -> Any:
    exc = Exception(message)
    exc._stackTrace = trace  # type: ignore[attr-defined]  # as pyspark's StreamingQueryException carries it
    runner: Any = object.__new__(FlowRunner)
    runner._closing, runner.query = closing, _Ended(exc)
    return runner


def test_an_hdfs_write_cut_by_our_stop_is_a_clean_stop_and_nothing_else_is() -> None:
    assert _runner(True, "Failed to shutdown streamer", HDFS_CUT).interrupted_by_stop()
    assert _runner(True, "Query terminated with exception", "java.nio.channels.ClosedByInterruptException").\
        interrupted_by_stop()
    assert not _runner(False, "Failed to shutdown streamer", HDFS_CUT).interrupted_by_stop()  # nobody stopped it
    assert not _runner(True, "Call From a to nn failed on connection exception: java.net.ConnectException: "
                             "Connection refused").interrupted_by_stop()
