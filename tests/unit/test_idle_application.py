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
