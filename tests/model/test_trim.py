"""The trimmed NLI graphs (engine.pipeline.trim) decide exactly as the untrimmed ones.

aegis-nli int8, the real classifier: its untrimmed graph is rebuilt here from the imported
package the way the pipeline builds it (rowwise requantisation, symbolic length, narrowed
relative span), and both graphs score the (memory, incoming fact) pairs of a labelled set of
the repository, one pair per pass and in batches of 32 of mixed lengths: identical scores, no
decision crosses a bar. No labels are read.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.pipeline import graph, span
from engine.pipeline.trim import trim_graph
from engine.runtime.base import BatchSettings
from engine.runtime.manifest import load_manifest
from engine.runtime.nli import NLIScorer

pytestmark = [pytest.mark.model, pytest.mark.export]

HELDOUT = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "heldout.jsonl"
BARS = (0.5, 0.8, 0.95)
LIMIT = 256


def _pairs() -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for line in HELDOUT.read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
        out += [(m["text"], case["incoming"]) for m in case["memories"]]
    return out[:LIMIT]


def _scorer(directory: Path, max_batch: int) -> NLIScorer:
    return NLIScorer(load_manifest(directory), batching=BatchSettings(max_batch=max_batch))


def _artefact(base: Path, model: Path, dest: Path) -> Path:
    """``base``'s artefact with ``model`` as its graph (fields and tokenizer kept)."""
    from engine.pipeline._common import _inherited_fields, _publish

    manifest = load_manifest(base)
    files = {"model.onnx": model, "tokenizer.json": manifest.tokenizer_path}
    return _publish(dest, files, _inherited_fields(base))


def test_aegis_trimmed_int8_decides_as_untrimmed(cache_dir: Path, tmp_path: Path) -> None:
    aegis = cache_dir / "models" / "aegis-nli"
    if not (aegis / "imported" / "manifest.json").is_file() or not HELDOUT.is_file():
        pytest.skip("aegis-nli is not built here, or the held-out set is missing")
    int8 = load_manifest(aegis / "int8")
    dynamic = int8.static_length is None
    untrimmed = tmp_path / "untrimmed.onnx"
    graph.rowwise_int8(
        load_manifest(aegis / "imported").model_path, untrimmed, dynamic_length=dynamic
    )
    span.narrow_relative_span(untrimmed, tmp_path / "narrowed.onnx")
    trimmed = tmp_path / "trimmed.onnx"
    record = trim_graph(tmp_path / "narrowed.onnx", trimmed)
    assert record["relative"] == 24 and record["relative_left"] == 0 and record["absmax"] > 0
    before = _artefact(aegis / "int8", tmp_path / "narrowed.onnx", tmp_path / "a" / "int8")
    after = _artefact(aegis / "int8", trimmed, tmp_path / "b" / "int8")
    pairs = _pairs()
    for size in (1, 32):
        p = _scorer(before, size).contradiction(pairs)
        q = _scorer(after, size).contradiction(pairs)
        np.testing.assert_array_equal(q, p, err_msg=f"sub-batch {size}")
        assert {t: int(((p > t) != (q > t)).sum()) for t in BARS} == dict.fromkeys(BARS, 0)


@pytest.mark.parametrize("name", ["aegis-nli", "nli-deberta-v3-small"])
def test_served_int8_graphs_are_trimmed_and_checked(cache_dir: Path, name: str) -> None:
    """What `make models` publishes: the int8 graph trimmed, its check recorded (bit-identical
    logits and no decision flip on the check set), no Tile left, and still row-invariant."""
    directory = cache_dir / "models" / name / "int8"
    if not (directory / "manifest.json").is_file():
        pytest.skip(f"{name}/int8 is not built in {cache_dir}")
    m = load_manifest(directory)
    record = m.extra.get("trim")
    if record is None:
        pytest.skip(f"{directory} was built before the trim step (pipeline version 2)")
    assert record["applied"] is True and record["max_abs_diff"] == 0.0
    assert set(record["flips"].values()) == {0} and record["relative_left"] == 0
    assert "Tile" not in graph.op_counts(m.model_path)
    assert m.extra["batch_invariance"]["invariant"] is True
