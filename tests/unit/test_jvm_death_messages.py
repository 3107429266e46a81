"""A JVM out of memory or dead is told in one line with its likely cause (no JVM needed here)."""

from __future__ import annotations

import pytest
from py4j.protocol import Py4JError, Py4JNetworkError

from streamling.runtime import jvm_death
from streamling.runtime.jvm_death import KILLED_HINT, MEMORY_HINT, jvm_failure


def test_an_out_of_memory_error_in_the_chain_names_itself_and_the_memory_keys() -> None:
    exc = RuntimeError("An error occurred while calling o381.load.\n: java.lang.OutOfMemoryError: Java heap space\n"
                       "\tat java.base/java.util.Arrays.copyOf(Arrays.java:3537)")
    found = jvm_failure(exc)
    assert found is not None
    assert found.what == "the Spark JVM ran out of memory (java.lang.OutOfMemoryError: Java heap space)"
    assert found.hint == MEMORY_HINT and "spark.driver.memory" in found.hint


def test_a_dead_gateway_is_explained_by_the_jvms_last_stderr_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jvm_death, "recent_lines", lambda: [
        "26/11/24 00:50:52 ERROR Executor: Exception in task 0.0 in stage 1.0 (TID 1)",
        "java.lang.OutOfMemoryError: Java heap space", "\tat java.base/java.util.Arrays.copyOf(Arrays.java:3537)"])
    lost = Py4JError("An error occurred while calling o424.isActive")
    lost.__context__ = Py4JNetworkError("Answer from Java side is empty")
    found = jvm_failure(lost)
    assert found is not None
    assert found.what == "the Spark driver JVM died (java.lang.OutOfMemoryError: Java heap space)"
    assert found.hint == MEMORY_HINT


def test_a_jvm_that_died_silently_was_killed_from_outside(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jvm_death, "recent_lines", list)
    found = jvm_failure(Py4JNetworkError("Error while sending or receiving"))
    assert found is not None and found.what == "the Spark driver JVM died" and found.hint == KILLED_HINT


def test_other_failures_are_left_alone() -> None:
    assert jvm_failure(ConnectionRefusedError("connection refused by the sink")) is None
    assert jvm_failure(ValueError("bad value")) is None


def test_a_stream_threads_overflow_trace_is_left_out_of_stderr_and_the_rest_kept() -> None:
    from streamling.runtime.jvm_output import visible

    header = ('Exception in thread "stream execution thread for app:s [id = 2ac4, runId = 2f03]" '
              "java.lang.StackOverflowError")
    frames = ["\tat java.base/java.util.regex.Pattern$Branch.match(Pattern.java:4734)"] * 3
    out, dropping = visible(["25/11/25 WARN Foo: before", header, *frames[:2]], False)
    assert out == ["25/11/25 WARN Foo: before"] and dropping
    out, dropping = visible([frames[2], "25/11/25 ERROR Bar: after", "\tat x.y(Z.java:1)"], dropping)
    assert out == ["25/11/25 ERROR Bar: after", "\tat x.y(Z.java:1)"] and not dropping
    assert visible(["Setting default log level to \"WARN\"."], False) == ([], False)


def test_an_error_whose_text_needs_a_gone_jvm_is_still_reported() -> None:
    """A py4j error renders itself by asking the JVM: after a stop the gateway is gone and ``str``
    raises. The error path names it by type and arguments instead of crashing on top of it."""
    from streamling.errors import chain_text

    class GatewayGone(Exception):
        def __str__(self) -> str:
            raise ConnectionRefusedError(111, "Connection refused")

    try:
        try:
            raise GatewayGone("o42.awaitTermination")
        except GatewayGone as inner:
            raise RuntimeError("the query stopped") from inner
    except RuntimeError as outer:
        text = chain_text(outer)
    assert text.splitlines() == ["the query stopped", "GatewayGone('o42.awaitTermination',)"]
