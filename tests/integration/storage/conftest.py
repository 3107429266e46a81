"""The S3-compatible store (``fixtures/services/up s3``), started once per session."""

from __future__ import annotations

import os

import pytest
from services import start_services


@pytest.fixture(scope="session")
def s3() -> dict[str, str]:
    if os.environ.get("STREAMLING_TEST_S3_ENDPOINT"):
        return {k: v for k, v in os.environ.items() if k.startswith(("STREAMLING_TEST_S3_", "STREAMLING_TEST_S3A_"))}
    return start_services("s3")
