"""The runtimes on the real artefacts: bucketing, order, truncation, odd input, tampering."""

from __future__ import annotations

import dataclasses
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.errors import InvalidInput, ManifestMismatch, ModelError
from engine.runtime.base import BatchSettings
from engine.runtime.embedder import Embedder
from engine.runtime.loader import ModelChoice, load_models, resolve_nli
from engine.runtime.manifest import load_manifest
from engine.runtime.nli import NLIScorer
from engine.runtime.session import SessionSettings

pytestmark = pytest.mark.model

TEXTS = [
    "The customer's office is in Denver.",
    "ok",
    "Maya moved to Austin last month after fifteen years in Colorado, and her sister followed.",
    "Zoë’s café in Zürich serves crème brûlée — 12 € — and 東京 ramen.",
    "Staging runs PostgreSQL 14.",
]


def test_embeddings_are_unit_length_and_independent_of_bucketing(
    models: tuple[Embedder, NLIScorer],
) -> None:
    embedder, _ = models
    batched = embedder.embed(TEXTS)
    one_by_one = np.stack([embedder.embed([t])[0] for t in TEXTS])
    assert batched.shape == (len(TEXTS), 384) and batched.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)
    # fp32: padding per bucket and the sort must not change any vector, and order is restored
    np.testing.assert_allclose(batched, one_by_one, atol=1e-5)


def test_buckets_are_length_sorted_and_within_the_token_budget(cache_dir: Path) -> None:
    manifest = load_manifest(cache_dir / "models" / "minilm" / "fp32")
    emb = Embedder(manifest, batching=BatchSettings(max_batch=2, max_batch_tokens=64))
    prepared = emb.preprocess(TEXTS * 3)
    widths = [b.feeds["input_ids"].shape[1] for b in prepared.buckets]
    assert widths == sorted(widths)
    assert all(b.feeds["input_ids"].size <= 64 or len(b.index) == 1 for b in prepared.buckets)
    assert sorted(np.concatenate([b.index for b in prepared.buckets]).tolist()) == list(range(15))
    assert prepared.stats.padded_tokens >= prepared.stats.real_tokens


def test_truncation_is_counted(models: tuple[Embedder, NLIScorer]) -> None:
    embedder, nli = models
    long = "word " * 2000
    before = embedder.totals.truncated
    vec = embedder.embed([long, "short"])
    assert embedder.totals.truncated == before + 1
    assert np.isfinite(vec).all()
    nbefore = nli.totals.truncated
    probs = nli.score([(long, "short"), ("short", "short")])
    assert nli.totals.truncated == nbefore + 1
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-5)


def test_empty_batches_and_bad_items(models: tuple[Embedder, NLIScorer]) -> None:
    embedder, nli = models
    assert embedder.embed([]).shape == (0, 384)
    assert nli.score([]).shape == (0, len(nli.labels))
    assert np.isfinite(embedder.embed([""])).all()  # an empty string is [CLS][SEP], not a crash
    with pytest.raises(InvalidInput):
        embedder.embed([None])  # type: ignore[list-item]
    with pytest.raises(InvalidInput):
        nli.score([("only one",)])  # type: ignore[list-item]


def test_offline_contradiction_model_on_the_seed_examples(cache_dir: Path) -> None:
    manifest = resolve_nli(cache_dir, ModelChoice(nli="aegis-nli"), "cpu")
    nli = NLIScorer(manifest)
    denver = "The customer's office is in Denver."
    chicago = nli.contradiction([(denver, "The customer's office is in Chicago.")])[0]
    cello = nli.contradiction([(denver, "The customer is learning to play the cello.")])[0]
    assert chicago > 0.95
    assert cello < 0.5


def test_random_weights_are_never_served_by_default(cache_dir: Path) -> None:
    with pytest.raises(ModelError):
        resolve_nli(cache_dir, ModelChoice(nli="nli-deberta-v3-small"), "cpu")
    m = resolve_nli(
        cache_dir, ModelChoice(nli="nli-deberta-v3-small", allow_random_weights=True), "cpu"
    )
    assert m.weights == "random" and m.labels == ("contradiction", "entailment", "neutral")


def test_three_label_model_scores_pairs(cache_dir: Path) -> None:
    choice = ModelChoice(nli="nli-deberta-v3-small", nli_variant="fp32", allow_random_weights=True)
    nli = NLIScorer(resolve_nli(cache_dir, choice, "cpu"))
    pairs = [("a b c", "d e f"), ("The office is in Denver.", "It is in Chicago."), ("x", "y")]
    batched = nli.score(pairs)
    single = np.stack([nli.score([p])[0] for p in pairs])
    assert batched.shape == (3, 3)
    np.testing.assert_allclose(batched, single, atol=1e-4)  # fp32: batch-invariant
    assert nli.entailment_index == 1 and nli.contradiction_index == 0


def copy_artefact(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_tampered_model_file_is_refused(cache_dir: Path, tmp_path: Path) -> None:
    art = copy_artefact(cache_dir / "models" / "minilm" / "int8", tmp_path / "int8")
    with (art / "model.onnx").open("r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(ManifestMismatch):
        Embedder(load_manifest(art))


def test_manifest_with_wrong_labels_is_refused(cache_dir: Path, tmp_path: Path) -> None:
    import json

    art = copy_artefact(cache_dir / "models" / "aegis-nli" / "imported", tmp_path / "aegis")
    raw = json.loads((art / "manifest.json").read_text())
    raw["labels"] = ["contradiction", "entailment", "neutral"]
    (art / "manifest.json").write_text(json.dumps(raw))
    with pytest.raises(ManifestMismatch):
        NLIScorer(load_manifest(art))


def test_cuda_is_refused_clearly_without_a_gpu(cache_dir: Path) -> None:
    from engine.runtime.session import cuda_available

    if cuda_available():
        pytest.skip("a CUDA provider is present; the GPU check runs instead")
    with pytest.raises(ModelError, match="gpu extra"):
        load_models(cache_dir, session=SessionSettings(device="cuda"))


def test_served_aegis_graph_is_narrowed_and_scores_as_the_wide_one(
    cache_dir: Path, tmp_path: Path
) -> None:
    """The served aegis graph reads only the relative positions its batch can have; against the
    same row-invariant graph without that rewrite (what the pipeline published before) every
    contradiction score is the same, short and long pairs batched together."""
    from engine.pipeline import graph

    manifest = resolve_nli(cache_dir, ModelChoice(nli="aegis-nli"), "cpu")
    relative = manifest.extra["relative_span"]
    assert relative["narrowed"] == 24 and relative["span"] == 256 and relative["left"] == 0
    imported = resolve_nli(cache_dir, ModelChoice(nli="aegis-nli", nli_variant="imported"), "cpu")
    wide = tmp_path / "wide.onnx"
    graph.rowwise_int8(imported.model_path, wide, dynamic_length=True)
    shutil.copy(manifest.tokenizer_path, tmp_path / "tokenizer.json")
    long = " ".join(["The invoice for the harbour office lists a late fee."] * 20)
    pairs = [
        ("Maya lives in Denver.", "Maya moved to Austin."),
        ("The clinic opens at 8.", "The clinic now opens at 9 on weekdays and 10 on Saturdays."),
        (long, "The late fee was waived."),
    ]
    served = NLIScorer(manifest).contradiction(pairs)
    wide_manifest = dataclasses.replace(
        manifest, directory=tmp_path, model_file=wide.name, tokenizer_file="tokenizer.json"
    )
    np.testing.assert_allclose(NLIScorer(wide_manifest).contradiction(pairs), served, atol=1e-6)


def test_quantised_nli_scores_do_not_depend_on_batch_mates(cache_dir: Path) -> None:
    pair = ("The customer's office is in Denver.", "The customer is learning to play the cello.")
    mates = [
        ("Maya lives in Denver, Colorado.", "Maya moved to Austin last month."),
        ("Maya lives in Denver, Colorado.", "Maya lives in Austin."),
        ("The customer's office is in Denver.", "The customer's office is in Chicago."),
    ]
    batch = [pair, *mates]
    # the default aegis variant is rowwise int8: measured invariant, so it batches
    manifest = resolve_nli(cache_dir, ModelChoice(nli="aegis-nli"), "cpu")
    assert manifest.variant == "int8" and manifest.extra["batch_invariance"]["invariant"]
    nli = NLIScorer(manifest)
    assert not nli.row_invariant and nli.max_batch == BatchSettings().max_batch
    apart = np.array([nli.contradiction([p])[0] for p in batch])
    np.testing.assert_allclose(nli.contradiction(batch), apart, atol=1e-4)
    # the imported graph scales activations per tensor: "auto" runs it one pair per pass ...
    imported = resolve_nli(cache_dir, ModelChoice(nli="aegis-nli", nli_variant="imported"), "cpu")
    nli = NLIScorer(imported)
    assert nli.row_invariant
    alone = nli.contradiction([pair])[0]
    np.testing.assert_allclose(nli.contradiction(batch)[0], alone, atol=1e-6)
    # ... because, batched, the pair's score moves with its batch-mates
    coupled = NLIScorer(imported, batching=BatchSettings(row_invariant="off"))
    together = coupled.contradiction(batch)
    apart = np.array([coupled.contradiction([p])[0] for p in batch])
    assert np.abs(together - apart).max() > 0.05


def test_texts_tokenised_for_the_budget_embed_as_plain_texts(
    models: tuple[Embedder, NLIScorer],
) -> None:
    """``encode_items`` (the batch budget's tokenisation) handed back to ``embed`` gives the
    same vectors, bit for bit, and the same counts as tokenising inside ``embed``; any mix of
    pre-tokenised and plain texts works, and a clipped text is counted once either way."""
    embedder, _ = models
    texts = [*TEXTS, "word " * 3000]
    encoded = embedder.encode_items(texts)
    assert [e.tokens for e in encoded] == embedder.token_lengths(texts)
    assert [e.clipped for e in encoded] == [0] * len(TEXTS) + [1]
    assert [e.encoding.ids for e in encoded] == [e.ids for e in embedder.encode(texts)]
    before = embedder.totals.clipped
    plain = embedder.embed(texts)
    assert embedder.totals.clipped == before + 1
    whole = embedder.embed(texts, encoded=encoded)
    assert embedder.totals.clipped == before + 2
    mixed = embedder.embed(texts, encoded=[e if i % 2 else None for i, e in enumerate(encoded)])
    np.testing.assert_array_equal(whole, plain)
    np.testing.assert_array_equal(mixed, plain)
    with pytest.raises(InvalidInput, match="encodings for"):
        embedder.embed(texts, encoded=encoded[:2])


class _CountingTokenizer:
    """The real tokenizer, counting the texts it is asked to encode."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.seen: Counter[str] = Counter()

    def encode_batch(self, inputs: list[Any], **kw: Any) -> Any:
        self.seen.update(i for i in inputs if isinstance(i, str))
        return self._real.encode_batch(inputs, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_a_written_fact_is_tokenised_once(
    models: tuple[Embedder, NLIScorer],
    make_gate: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through the engine core, as the server writes: a fact's text is tokenised once, for
    the batch budget, and that encoding is what the embedder runs (before: twice)."""
    from engine.app import build_engine
    from engine.core import CoreSettings, SyncEngine
    from engine.types import Fact

    embedder, _ = models
    spy = _CountingTokenizer(embedder.tokenizer)
    monkeypatch.setattr(embedder, "tokenizer", spy)
    gate = make_gate()
    with SyncEngine(build_engine(gate, CoreSettings(expiry_interval_s=None))) as eng:
        first = eng.triage([Fact("tok/once", "Alice lives in Denver.")], apply=True)
        second = eng.triage([Fact("tok/once", "Alice lives in Chicago.")], apply=True)
    assert [first.decisions[0].action, second.decisions[0].action] == ["add", "replace"]
    assert spy.seen["Alice lives in Denver."] == 1
    assert spy.seen["Alice lives in Chicago."] == 1


def test_a_call_is_split_at_a_length_jump_and_scores_as_the_greedy_cut(cache_dir: Path) -> None:
    manifest = resolve_nli(cache_dir, ModelChoice(nli="aegis-nli"), "cpu")
    short = [(t, "The customer is in Denver.") for t in TEXTS[:4]]
    paragraph = " ".join(TEXTS[2] for _ in range(12))
    long = [(f"{paragraph} Note {i}.", "Maya lives in Austin.") for i in range(12)]
    pairs = [*long[:6], *short, *long[6:]]  # arrival order mixes them
    split = NLIScorer(manifest, batching=BatchSettings(max_batch=16))
    greedy = NLIScorer(manifest, batching=BatchSettings(max_batch=16, length_split=False))
    p_split, p_greedy = split.preprocess(pairs), greedy.preprocess(pairs)
    assert [len(b.index) for b in p_greedy.buckets] == [16]
    assert sorted(len(b.index) for b in p_split.buckets) == [4, 12]
    assert p_split.stats.real_tokens == p_greedy.stats.real_tokens
    assert p_split.stats.padded_tokens < p_greedy.stats.padded_tokens
    alone = np.array([split.contradiction([p])[0] for p in pairs])
    np.testing.assert_allclose(split.contradiction(pairs), alone, atol=1e-4)
    np.testing.assert_allclose(greedy.contradiction(pairs), alone, atol=1e-4)
