"""Shared helpers for the simulator tests: committed trace excerpts and small generated traces."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture
def data_dir() -> Path:
    return DATA

