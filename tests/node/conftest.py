"""Fixtures for the node tests: the fake libnvidia-ml.so.1, built once per session."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from tests.fakes.nvml_fake import build_library


@pytest.fixture(scope="session")
def fake_nvml_library() -> Path:
    """The fake NVML built with gcc (cached in tests/fakes/build/); skips where there is no gcc."""
    if shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.skip("gcc is needed to build the fake libnvidia-ml.so.1")
    return build_library()
