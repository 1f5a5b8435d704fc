"""GPU-only tests: run by `make gpu-test` on a machine with an NVIDIA GPU, skipped elsewhere."""

from __future__ import annotations

import pytest

from tests.gpu.torchlab import has_gpu as _has_gpu


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (run make gpu-test on a GPU machine)")
    has_gpu = _has_gpu()
    for item in items:
        if "tests/gpu/" in str(item.fspath):
            item.add_marker(pytest.mark.gpu)
            if not has_gpu:
                item.add_marker(skip)
