"""Batch invariance of every quantised NLI model that batches: a pair scores the same alone as
inside batches of mixed lengths (within 1e-4), and no pair crosses a policy threshold.

Pairs: the (memory, incoming fact) pairs of two labelled sets of the repository. No labels are
read: only scores alone against batched.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.runtime.base import BatchSettings, batch_invariant
from engine.runtime.loader import ModelChoice, resolve_nli
from engine.runtime.nli import NLIScorer
from engine.runtime.tuning import CANDIDATES

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]
SETS = {
    "heldout": ROOT / "benchmarks" / "data" / "heldout.jsonl",
    "heldout2": ROOT / "benchmarks" / "data" / "heldout2.jsonl",
}
THRESHOLDS = (0.5, 0.8, 0.95)
LIMIT = 320
"""Pairs per set: enough for every length the sets hold, bounded so the test stays short."""


def _pairs(path: Path) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
        out += [(m["text"], case["incoming"]) for m in case["memories"]]
    return out[:LIMIT]


ROUTES = [
    (name, variant)
    for name in ("aegis-nli", "nli-deberta-v3-small")
    for variant in ("int8", "int8-static")
]
"""The default int8 route and the static one (calibrated activation scales, built by
``engine.pipeline.static.build_static``; skipped where that variant is not built)."""


@pytest.mark.parametrize(("name", "variant"), ROUTES)
@pytest.mark.parametrize("pair_set", sorted(SETS))
def test_batched_scores_match_scores_alone(
    cache_dir: Path, name: str, variant: str, pair_set: str
) -> None:
    if not SETS[pair_set].is_file():
        pytest.skip(f"{SETS[pair_set]} is not on this machine")
    if (
        variant != "int8"
        and not (cache_dir / "models" / name / variant / "manifest.json").is_file()
    ):
        pytest.skip(f"{name}/{variant} is not built in {cache_dir}")
    choice = ModelChoice(nli=name, nli_variant=variant, allow_random_weights=True)
    manifest = resolve_nli(cache_dir, choice, "cpu")
    assert manifest.variant == variant and batch_invariant(manifest), manifest.describe()
    assert manifest.extra["quantization"]["method"] in ("rowwise", "blockwise", "static")
    pairs = _pairs(SETS[pair_set])
    alone = NLIScorer(manifest, batching=BatchSettings(max_batch=1)).contradiction(pairs)
    rng = np.random.default_rng(0)
    # Every sub-batch size the tuner may choose (engine.runtime.tuning), and 128.
    for size in sorted({*CANDIDATES[1:], 128}):
        scorer = NLIScorer(manifest, batching=BatchSettings(max_batch=size))
        assert not scorer.row_invariant and scorer.max_batch == size
        order = rng.permutation(len(pairs))  # arrival order: batch-mates of every length
        got = np.empty(len(pairs), dtype=np.float32)
        got[order] = scorer.contradiction([pairs[i] for i in order])
        np.testing.assert_allclose(got, alone, atol=1e-4, rtol=0)
        flips = {t: int(((got > t) != (alone > t)).sum()) for t in THRESHOLDS}
        assert flips == dict.fromkeys(THRESHOLDS, 0), (size, flips)


def test_non_invariant_graph_keeps_the_one_pair_fallback(cache_dir: Path) -> None:
    manifest = resolve_nli(cache_dir, ModelChoice(nli="aegis-nli", nli_variant="imported"), "cpu")
    assert not batch_invariant(manifest)
    nli = NLIScorer(manifest, batching=BatchSettings(max_batch=64))
    assert nli.row_invariant and nli.max_batch == 1
