"""The NLI sub-batch tuner (engine.runtime.tuning) over a fake runtime whose speed per
sub-batch size is given: which size wins, what is recorded next to the manifest, when the
record is reused and when the machine changed and it is measured again, and the override."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.errors import InvalidInput
from engine.runtime import tuning


@dataclass
class FakeManifest:
    directory: Path
    model_file: str = "model.onnx"
    files: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {"model.onnx": {"sha256": "ab" * 32}}
    )


class FakeNLI:
    """Scores instantly; ``sizes`` records the sub-batch size of every call."""

    def __init__(self, directory: Path, row_invariant: bool = False) -> None:
        self.manifest = FakeManifest(directory)
        self.row_invariant = row_invariant
        self.max_batch = 1 if row_invariant else 32
        self.sizes: list[int] = []

    def score(self, pairs: Any) -> np.ndarray:
        self.sizes.append(self.max_batch)
        return np.zeros((len(pairs), 3), dtype=np.float32)


def test_the_fastest_size_wins_and_near_ties_go_to_the_larger() -> None:
    assert tuning.choose({1: 160.0, 8: 202.0, 32: 132.0}) == 8
    assert tuning.choose({8: 200.0, 16: 198.0, 32: 150.0}) == 16
    with pytest.raises(InvalidInput):
        tuning.choose({})


def test_measure_visits_every_size_and_restores_the_model(tmp_path: Path) -> None:
    nli = FakeNLI(tmp_path)
    rates = tuning.measure(nli, (1, 8, 32), rounds=2)
    assert set(rates) == {1, 8, 32} and all(r > 0 for r in rates.values())
    assert nli.max_batch == 32 and nli.sizes.count(8) == 2


def test_a_measured_size_is_recorded_and_reused_on_the_same_machine(tmp_path: Path) -> None:
    measured: list[int] = []

    def timer(model: Any) -> dict[int, float]:
        measured.append(1)
        return {1: 100.0, 8: 200.0, 32: 120.0}

    nli = FakeNLI(tmp_path)
    assert tuning.tune_nli(nli, timer=timer) == 8 and nli.max_batch == 8
    record = json.loads((tmp_path / tuning.SUB_BATCH_FILE).read_text())
    assert record["sub_batch"] == 8 and record["machine"]["model_sha256"] == "ab" * 32
    again = FakeNLI(tmp_path)
    assert tuning.tune_nli(again, timer=timer) == 8 and measured == [1]  # reused
    # Another machine (here: another model file) measures again.
    other = FakeNLI(tmp_path)
    other.manifest.files = {"model.onnx": {"sha256": "cd" * 32}}
    assert tuning.tune_nli(other, timer=timer) == 8 and measured == [1, 1]


def test_an_override_wins_and_a_non_invariant_graph_stays_at_one(tmp_path: Path) -> None:
    nli = FakeNLI(tmp_path)
    assert tuning.tune_nli(nli, 4) == 4 and nli.max_batch == 4
    assert not (tmp_path / tuning.SUB_BATCH_FILE).exists()
    with pytest.raises(InvalidInput):
        tuning.tune_nli(nli, 0)
    fixed = FakeNLI(tmp_path, row_invariant=True)
    assert tuning.tune_nli(fixed) == 1 and tuning.tune_nli(fixed, 16) == 1
