"""Two hosts: ``fixtures/services/up spark_multihost hdfs``.

Host A is this machine's network namespace (the master, worker a, the drivers, HDFS); host B a
network and mount namespace of ours with worker b, which sees only its own Spark copy, Java and the
system's Python: not the repository, the ``.venv`` or the driver's files. Drivers bind to host A's
address on the pair that joins the two, so executors on host B reach them.
"""

from __future__ import annotations

import pytest
from services import start_services


@pytest.fixture(scope="session")
def two_hosts() -> dict[str, str]:
    """The cluster's and HDFS's exports (master URL, driver host, workers' pid files, HDFS URL).

    A test that kills a worker calls ``start_services("spark_multihost")`` again when done: ``up``
    restarts the dead worker, so later tests find both again."""
    exports = start_services("spark_multihost", "hdfs")
    assert "STREAMLING_TEST_MULTIHOST_MASTER" in exports and "STREAMLING_TEST_HDFS_URL" in exports, exports
    return exports
