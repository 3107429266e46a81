"""When a standby driver may register its application with a cluster's master before it is needed:
only where it then holds no executor and later gets the executors a cold driver would have."""

from __future__ import annotations

from typing import Any

import pytest

from streamling.config import load_settings
from streamling.runtime.session import idle_conf


def _settings(master: str, conf: dict[str, str] | None = None) -> Any:
    return load_settings(None, overrides={"spark": {"master": master, "conf": conf or {}}})


def test_a_cluster_application_registers_with_no_executor_and_never_gives_claimed_ones_back() -> None:
    conf = idle_conf(_settings("spark://10.0.0.1:7077"))
    assert conf is not None
    assert conf["spark.dynamicAllocation.enabled"] == "true"
    assert conf["spark.dynamicAllocation.initialExecutors"] == conf["spark.dynamicAllocation.minExecutors"] == "0"
    # executors holding shuffle files are tracked (no external shuffle service needed), and idle
    # ones stay: a streaming job's executors wait between epochs
    assert conf["spark.dynamicAllocation.shuffleTracking.enabled"] == "true"
    assert conf["spark.dynamicAllocation.executorIdleTimeout"].endswith("d")


def test_a_standby_that_keeps_executors_registers_with_them_and_claims_the_rest_later() -> None:
    conf = idle_conf(_settings("spark://h:7077", {"spark.cores.max": "3"}), keep=1)
    assert conf is not None
    assert conf["spark.dynamicAllocation.initialExecutors"] == conf["spark.dynamicAllocation.minExecutors"] == "1"
    assert conf["spark.dynamicAllocation.enabled"] == "true"


def test_no_idle_application_locally_or_where_spark_conf_chooses_the_executors() -> None:
    assert idle_conf(_settings("local[2]")) is None
    assert idle_conf(_settings("spark://h:7077", {"spark.executor.instances": "2"})) is None
    assert idle_conf(_settings("spark://h:7077", {"spark.dynamicAllocation.enabled": "false"})) is None
    assert idle_conf(_settings("spark://h:7077", {"spark.dynamicAllocation.maxExecutors": "4"})) is None


def test_a_master_that_refuses_the_claim_costs_only_the_head_start(caplog: pytest.LogCaptureFixture) -> None:
    from types import SimpleNamespace

    from streamling.runtime.session import claim_executors

    def refuse(_n: int) -> None:
        raise RuntimeError("py4j: the master is unreachable\nat …")

    spark = SimpleNamespace(sparkContext=SimpleNamespace(_jsc=SimpleNamespace(
        sc=lambda: SimpleNamespace(requestExecutors=refuse))))
    with caplog.at_level("WARNING", logger="streamling.runtime.session"):
        claim_executors(spark)  # type: ignore[arg-type]  # does not raise: the attempt runs on
    assert "could not ask the cluster's master for executors" in caplog.text
    assert "the master is unreachable" in caplog.text and "at …" not in caplog.text


def _fake_spark(executors: int, job: Any) -> Any:
    from types import SimpleNamespace

    jsc = SimpleNamespace(sc=lambda: SimpleNamespace(getExecutorIds=lambda: SimpleNamespace(size=lambda: executors)))
    context = SimpleNamespace(_jsc=jsc, defaultParallelism=2, setJobGroup=lambda *a, **k: None,
                              cancelJobGroup=lambda group: None)
    frame = SimpleNamespace(selectExpr=lambda *a: SimpleNamespace(mapInArrow=lambda *a: SimpleNamespace(
        collect=job)))
    return SimpleNamespace(sparkContext=context, range=lambda *a, **k: frame)


def test_a_warm_up_that_fails_on_the_executors_is_said_once_and_only_costs_the_head_start(
        caplog: pytest.LogCaptureFixture) -> None:
    import threading

    from streamling.runtime.session import warm_executors

    def fails() -> None:
        raise RuntimeError("PythonException: ModuleNotFoundError: No module named 'acme_plugin'\n  at …")

    with caplog.at_level("INFO", logger="streamling.runtime.session"):
        warming = warm_executors(_fake_spark(1, fails), 1, ("acme_plugin",), threading.Event())
        warming.join(5)
    assert not warming.is_alive()
    [said] = [r.getMessage() for r in caplog.records if "could not be warmed up" in r.getMessage()]
    assert "No module named 'acme_plugin'" in said and "at …" not in said and "the first epoch does it" in said


def test_a_standby_whose_executors_never_come_is_ready_without_them_and_says_why(
        tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The active driver holds every core (no spark.cores.max): the standby waits for its executors
    ``WARM_UP_SECS``, then is ready without them and names the setting to change."""
    import threading
    from types import SimpleNamespace

    from streamling.bundle.standby import Standby
    from streamling.runtime.session import warm_executors

    stop = threading.Event()
    warming = warm_executors(_fake_spark(0, lambda: None), 1, (), stop)  # no executor ever registers
    standby = Standby(SimpleNamespace(standby=str(tmp_path / "go"), root=str(tmp_path), deployment="1", job="j",
                                      task="t"))
    standby.WARM_UP_SECS = 0.3
    with caplog.at_level("WARNING", logger="streamling.bundle.driver"):
        standby._await_warm_up(warming, 1, threading.Event())
    assert warming.is_alive()  # it keeps asking
    stop.set()
    warming.join(5)
    [said] = [r.getMessage() for r in caplog.records]
    assert "the cluster gave none of its 1 executor(s) in 0s" in said and "spark.cores.max" in said


def test_a_local_warm_up_that_fails_is_said_once_and_only_costs_the_head_start(
        caplog: pytest.LogCaptureFixture) -> None:
    """A local standby's or pooled driver's Python workers cannot start (a module its nodes need is
    missing): one line, no traceback, and the driver still becomes ready (the call returns)."""
    from streamling.runtime.session import warm_local_workers

    def fails() -> None:
        raise RuntimeError("PythonException: ModuleNotFoundError: No module named 'acme_plugin'\n  at …")

    with caplog.at_level("INFO", logger="streamling.runtime.session"):
        warm_local_workers(_fake_spark(0, fails), ("acme_plugin",))
    [said] = [r.getMessage() for r in caplog.records]
    assert "could not be warmed up" in said and "No module named 'acme_plugin'" in said
    assert "at …" not in said and "the first epoch starts them" in said


def test_a_pooled_driver_warms_with_the_warm_up_pipeline_or_without_it(
        tmp_path: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pooled driver has no task: its Python workers import the warm-up pipeline's node modules. If
    the target's settings do not plan that pipeline, it warms with streamling's own nodes module and
    says so in one line (the task that takes it reports its own settings' problems)."""
    from streamling.bundle.standby import Standby
    from streamling.config import load_settings
    from streamling.runtime import planner

    settings = load_settings(environ={}, cwd=tmp_path)
    plan = Standby._warm_up_plan(settings)
    assert Standby._modules(plan) == ("streamling.sinks.blackhole", "streamling.sources.generate",
                                      "streamling.transforms.sql")

    def refuse(*_a: Any, **_k: Any) -> None:
        raise ValueError("plugin.path: /nowhere is not a folder\nmore")

    monkeypatch.setattr(planner, "build_plan", refuse)
    with caplog.at_level("INFO", logger="streamling.bundle.driver"):
        assert Standby._warm_up_plan(settings) is None
    assert Standby._modules(None) == ("streamling.runtime.nodes",)
    [said] = [r.getMessage() for r in caplog.records]
    assert "the warm-up pipeline does not plan (plugin.path: /nowhere is not a folder)" in said
