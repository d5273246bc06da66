"""Fixtures of the adapter tests: a real in-process engine on the real models."""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Callable

import pytest

from engine.adapters import LocalEngine

# mem0 reads this once, at import: no telemetry (posthog) from the tests.
os.environ.setdefault("MEM0_TELEMETRY", "False")

if importlib.util.find_spec("trustcall") is not None:
    # trustcall 0.0.39 (LangMem's extractor) imports Send from langgraph.constants, deprecated
    # in LangGraph 1.0; not ours to fix, and filterwarnings=error would refuse the import.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Importing Send from langgraph.constants")
        import trustcall  # noqa: F401


@pytest.fixture
def real_engine(make_gate: Callable[..., object]) -> LocalEngine:
    """A LocalEngine over a real Gate (MiniLM + aegis NLI, SQLite in tmp_path)."""
    return LocalEngine(make_gate())
