"""The repository's own ``bundle.yml``: its Kafka → Postgres notebook deployed and run as a job on the
``local`` target, with a job parameter that changes what the deployed pipeline writes."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobs import NOTEBOOK_EVENTS, ROOT, bundle, produce_orders, runs, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.spark, pytest.mark.postgres, pytest.mark.kafka]


@pytest.fixture
def env(tmp_path: Path, pg_environ: dict[str, str], kafka_service: dict[str, str]) -> Iterator[dict[str, str]]:
    environ = {k: v for k, v in pg_environ.items() if not k.startswith(("BUNDLE_VAR_", "STREAMLING__KAFKA"))}
    environ.update(kafka_service)
    environ["BUNDLE_VAR_root_path"] = str(tmp_path / "root")
    yield environ
    bundle(ROOT, environ, "destroy", "--auto-approve")


def _table(pg: Any, table: str) -> list[tuple[Any, ...]]:
    try:
        return list(pg.execute(f'SELECT id, customer, amount, large FROM notebook."{table}" ORDER BY id'))
    except Exception:  # not created yet
        return []


def test_repo_bundle_runs_the_kafka_notebook_with_a_job_parameter(
        env: dict[str, str], pg: Any, unique_topic: str, unique_name: str, kafka_service: dict[str, str]) -> None:
    validated = bundle(ROOT, env, "validate")
    assert validated.returncode == 0, validated.stderr
    produce_orders(kafka_service["STREAMLING_TEST_KAFKA_BOOTSTRAP"],
                   kafka_service["STREAMLING_TEST_SCHEMA_REGISTRY_URL"], unique_topic, NOTEBOOK_EVENTS)
    started = time.monotonic()
    deployed = bundle(ROOT, env, "deploy")
    assert deployed.returncode == 0, deployed.stderr
    # Development mode pauses the continuous job: nothing runs until asked.
    assert runs(ROOT, env) == []
    run = bundle(ROOT, env, "run", "kafka_to_postgres", "--param", f"topic={unique_topic}",
                 "--param", f"table={unique_name}", "--param", "min_amount=20")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "is a continuous job: it keeps running" in run.stdout
    # The notebook's own data gives orders 1, 2 and 5 with min_amount 0; the parameter drops order 2 (15.5).
    rows = wait_for(lambda: _table(pg, unique_name) == [(1, "ada", 125.0, True), (5, "eve", 42.0, False)]
                    and _table(pg, unique_name), 240, "the parameterised rows in Postgres")
    print(f"local target: deploy → rows in Postgres {time.monotonic() - started:.1f}s")
    assert rows
    [job_run] = runs(ROOT, env, "kafka_to_postgres")
    assert job_run["params"]["min_amount"] == "20" and job_run["state"] == "running"
    # The run view shows the driver's own figures (what its admin API serves), read while it runs.
    # (an epoch's rows are counted when its sinks flushed, its checkpoint once Spark committed it: the
    # driver writes its figures in between too, so wait for both)
    figures = wait_for(lambda: (f := runs(ROOT, env, "kafka_to_postgres")[0]["attempts"][-1]["figures"])
                       and f["rows_to_sinks"] >= 3 and f["checkpoint"]["epochs_succeeded"] >= 1 and f, 60,
                       "the driver's figures")
    assert figures["status"] == "running"
    assert figures["nodes"]["orders"]["kind"] == "source" and figures["admin_api"].startswith("http://127.0.0.1:")
    summary = json.loads(bundle(ROOT, env, "summary", "-o", "json").stdout)
    assert summary["jobs"]["kafka_to_postgres"]["last_run"]["figures"]["rows_to_sinks"] >= 3
    cancelled = bundle(ROOT, env, "cancel", str(job_run["run_id"]))
    assert cancelled.returncode == 0, cancelled.stderr
    final = wait_for(lambda: [r for r in runs(ROOT, env, "kafka_to_postgres") if r["state"] == "cancelled"], 90,
                     "the run to stop after its epoch")
    assert final[0]["attempts"][0]["exit_code"] == 0  # SIGTERM finished the epoch and exited cleanly
    logs = bundle(ROOT, env, "logs", str(job_run["run_id"]))
    assert "received SIGTERM: finishing the current epoch" in logs.stdout
