"""The Spark standalone cluster for integration tests: ``fixtures/services/up spark`` (a master and
two one-core workers on 127.0.0.1).

Unlike the other services, an already exported ``STREAMLING_TEST_SPARK_MASTER`` is not taken as is:
tests here kill workers through the script's pid files and heal the cluster with the script, so the
cluster must be the script's. ``up spark`` answers in about half a second when it already runs.
The exports are not written into ``os.environ``; tests get them through the fixture below.
"""

from __future__ import annotations

import pytest
from services import start_services


@pytest.fixture(scope="session")
def spark_cluster() -> dict[str, str]:
    """The cluster's exports: master URL, master UI URL, workers' pid files, state folder.

    A test that kills a worker calls ``start_services("spark")`` again when done: ``up spark``
    restarts missing workers, so later tests find two again.
    """
    exports = start_services("spark")
    assert "STREAMLING_TEST_SPARK_MASTER" in exports, exports
    return exports
