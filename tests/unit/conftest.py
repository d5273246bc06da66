"""Unit tests run before `make models` (CI's `make check` runs them on a clean clone): a unit
test that asks for the real models fails here too, not only on CI."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    pytest.fail(
        "a unit test may not load the models (CI runs tests/unit before `make models`): "
        "move it to tests/integration or tests/model"
    )
