"""The driver's JVM dies under a running pipeline: one error line saying so and why, exit code 2,
none of py4j's or PySpark's tracebacks about the lost connection."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[2]


def test_a_killed_jvm_is_reported_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "pipeline.yaml").write_text("""
sources:
  s: {type: generate, rows_per_second: 1000}
sinks:
  out: {type: blackhole, from: s}
""")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMLING__")}
    env.update(STREAMLING_CACHE_DIR=str(ROOT / ".cache"), STREAMLING__CHECKPOINT_INTERVAL_SEC="1")
    log = tmp_path / "stderr.txt"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "streamling.cli", "pipeline.yaml"], cwd=tmp_path, env=env,
                                stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + 240
            while "epoch 0 finalized" not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.3)
            [jvm] = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
            assert Path(f"/proc/{jvm}/comm").read_text().strip() == "java"
            os.kill(int(jvm), signal.SIGKILL)  # as the kernel's OOM killer would
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
    lines = log.read_text().splitlines()
    print(f"stderr after the JVM died: {len(lines)} lines")
    assert code == 2, "\n".join(lines[-40:])
    errors = [line for line in lines if " ERROR " in line]
    assert len(errors) == 1, "\n".join(lines[-40:])
    assert errors[0].endswith("ERROR streamling: the Spark driver JVM died — it wrote no error, so it was likely "
                              "killed from outside (the kernel's OOM killer or a container memory limit): give the "
                              "process more memory or lower spark.driver.memory")
    assert not any("Traceback" in line or line.startswith(("\t", " ")) for line in lines), "\n".join(lines)
