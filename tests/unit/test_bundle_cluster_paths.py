"""A bundle target whose master spans hosts: paths that each host would resolve on its own disk are
refused by ``bundle validate`` (and so by ``deploy``, before anything changes), naming the task."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

NOTEBOOK = """# Databricks notebook source
# MAGIC %load_ext streamling

# COMMAND ----------

# MAGIC %%streamling source orders
# MAGIC type: generate
# MAGIC rows: 10
# MAGIC primary_key: id

# COMMAND ----------

# MAGIC %%streamling sink lake --from orders --type delta
# MAGIC path: {lake}
"""

BUNDLE = """bundle:
  name: lakes
resources:
  jobs:
    load:
      tasks:
        - task_key: load
          notebook_task:
            notebook_path: ./load.py
targets:
  one_host:
    default: true
    config: {{spark: {{master: "spark://127.0.0.1:7077"}}}}
  two_hosts:
    config: {{spark: {{master: "spark://10.0.0.1:7077"}}{state}}}
"""


def _validate(root: Path, target: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamling.cli", "bundle", "validate", "-t", target], cwd=root,
                          capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(root)})


def test_a_table_on_one_hosts_disk_is_refused_for_a_target_spanning_hosts(tmp_path: Path) -> None:
    (tmp_path / "load.py").write_text(NOTEBOOK.format(lake="./lake"))
    (tmp_path / "bundle.yml").write_text(BUNDLE.format(state=""))
    assert _validate(tmp_path, "one_host").returncode == 0  # one host: its disk is everybody's
    proc = _validate(tmp_path, "two_hosts")
    assert proc.returncode != 0
    assert ("delta sink 'lake': path './lake' is a relative path: on the cluster at spark://10.0.0.1:7077 it would "
            "resolve on each host differently") in proc.stderr
    assert "while checking task 'load' of job 'load' on target 'two_hosts' for a cluster of several hosts" \
        in proc.stderr, proc.stderr


def test_shared_storage_passes(tmp_path: Path) -> None:
    (tmp_path / "load.py").write_text(NOTEBOOK.format(lake="hdfs://nn:8020/lake"))
    (tmp_path / "bundle.yml").write_text(BUNDLE.format(state=", state_dir: hdfs://nn:8020/state"))
    proc = _validate(tmp_path, "two_hosts")
    assert proc.returncode == 0, proc.stderr
