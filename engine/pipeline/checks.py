"""The fixed check set, and the figures that say whether an ONNX graph still is the model.

Every artefact is run on the same sentences (for embedders) or sentence pairs (for NLI models),
tokenised by the artefact's own ``tokenizer.json``, and compared with PyTorch on identical ids:
embedders by their pooled, normalised vectors, NLI models by their logits. The set mixes English,
German, Japanese, accents, emoji, a one-word input and one input longer than any max length, so
truncation, padding masks and the last position embeddings are all exercised.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import InvalidInput, ModelError

__all__ = [
    "CHECK_SET_ID",
    "PAIRS",
    "TEXTS",
    "INVARIANCE_ATOL",
    "CheckBatch",
    "Tolerance",
    "batch_invariance",
    "compare",
    "check",
    "encode",
    "gather",
    "pool",
]

_LONG = " ".join(
    f"On day {i} of the walk along the coast the user noted the tide, the wind from the "
    f"north-west and a café in the harbour that served grilled sardines; the note ends here."
    for i in range(1, 31)
)

TEXTS: tuple[str, ...] = (
    "The user prefers green tea over coffee in the morning.",
    "My flight to Lisbon leaves on Friday at 07:15.",
    "Ich wohne seit 2019 in München und arbeite in einer Bäckerei am Marienplatz.",
    "東京の天気は明日は晴れるでしょう。",
    "Café déjà vu: naïve façade, Ελληνικά, русский текст, emoji 🚀✨.",
    "ok",
    "The user's daughter is allergic to peanuts.",
    _LONG,
)

PAIRS: tuple[tuple[str, str], ...] = (
    ("The user prefers green tea over coffee.", "The user prefers coffee over green tea."),
    ("The user lives in Berlin.", "The user lives in Germany."),
    ("Meine Tochter ist gegen Erdnüsse allergisch.", "Meine Tochter verträgt Erdnüsse gut."),
    ("東京は今日晴れです。", "東京は今日雨です。"),
    ("The meeting moved to Thursday at 3 pm.", "The meeting is on Thursday afternoon."),
    ("I have a dog named Max.", "I have a cat."),
    ("Café au lait ☕ costs €3.50 here.", "Coffee is free here."),
    (_LONG, "The text is about a walk along the coast."),
)

CHECK_SET_ID = hashlib.sha256(repr((TEXTS, PAIRS)).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class CheckBatch:
    """A padded batch of the check set and the positions of its rows in the set."""

    feeds: dict[str, np.ndarray]
    rows: tuple[int, ...]


@dataclass(frozen=True)
class Tolerance:
    """How far an artefact may drift from its reference before the build fails."""

    atol: float
    """Largest allowed absolute difference (pooled vectors or logits)."""
    min_cosine: float | None = None
    """Smallest allowed cosine between an embedding and its reference (embedders only)."""

    def __post_init__(self) -> None:
        if not self.atol >= 0:
            raise InvalidInput(f"atol must be >= 0, got {self.atol}")
        if self.min_cosine is not None and not -1.0 <= self.min_cosine <= 1.0:
            raise InvalidInput(f"min_cosine must be in [-1, 1], got {self.min_cosine}")


def encode(
    tokenizer_path: Path,
    items: Sequence[str] | Sequence[tuple[str, str]],
    *,
    max_length: int,
    pad_id: int,
    batch_size: int = 4,
    static_length: int | None = None,
) -> list[CheckBatch]:
    """Tokenise ``items`` into length-sorted, padded batches (less padding, still some)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_path))
    tok.enable_truncation(max_length)
    tok.no_padding()
    encodings = tok.encode_batch(list(items))
    order = sorted(range(len(encodings)), key=lambda i: len(encodings[i].ids))
    batches = []
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        width = static_length or max(len(encodings[i].ids) for i in rows)
        ids = np.full((len(rows), width), pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        types = np.zeros((len(rows), width), dtype=np.int64)
        for r, i in enumerate(rows):
            enc = encodings[i]
            n = len(enc.ids)
            ids[r, :n], mask[r, :n], types[r, :n] = enc.ids, enc.attention_mask, enc.type_ids
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        batches.append(CheckBatch(feeds, tuple(rows)))
    return batches


def pool(hidden: np.ndarray, mask: np.ndarray, pooling: str, normalize: bool) -> np.ndarray:
    """Pool token vectors ``[b, s, d]`` into sentence vectors ``[b, d]`` as the runtime does."""
    hidden = hidden.astype(np.float64)
    if pooling == "cls":
        out = hidden[:, 0]
    elif pooling == "mean":
        m = mask[..., None].astype(np.float64)
        out = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
    else:
        raise ModelError(f"unsupported pooling {pooling!r}")
    if normalize:
        out = out / np.clip(np.linalg.norm(out, axis=1, keepdims=True), 1e-12, None)
    return out


Runner = Callable[[dict[str, np.ndarray]], np.ndarray]


def gather(batches: Sequence[CheckBatch], run: Runner) -> np.ndarray:
    """Run every batch and put the rows back in check-set order."""
    parts = [(b.rows, run(b.feeds)) for b in batches]
    n = sum(len(rows) for rows, _ in parts)
    first = parts[0][1]
    out = np.zeros((n, *first.shape[1:]), dtype=np.float64)
    for rows, values in parts:
        out[list(rows)] = values
    return out


def compare(got: np.ndarray, ref: np.ndarray, *, task: str) -> dict[str, Any]:
    """The parity figures of ``got`` against ``ref`` (rows in the same order)."""
    if got.shape != ref.shape:
        raise ModelError(f"output shape {got.shape} differs from the reference's {ref.shape}")
    if not np.isfinite(got).all():
        raise ModelError("the graph produced non-finite outputs on the check set")
    diff = float(np.abs(got - ref).max())
    figures: dict[str, Any] = {"max_abs_diff": diff, "n": int(got.shape[0])}
    if task == "embedding":
        g = got / np.clip(np.linalg.norm(got, axis=1, keepdims=True), 1e-12, None)
        r = ref / np.clip(np.linalg.norm(ref, axis=1, keepdims=True), 1e-12, None)
        cos = (g * r).sum(axis=1)
        figures.update(min_cosine=float(cos.min()), mean_cosine=float(cos.mean()))
    else:
        agree = got.argmax(axis=1) == ref.argmax(axis=1)
        figures.update(argmax_agreement=float(agree.mean()))
    return figures


INVARIANCE_ATOL = 1e-4
"""Largest change of an output (logit or pooled component) that still counts as the same result
when an input is run alone and inside a batch: fp32 noise from a wider padded width is ~1e-6; a
per-tensor activation scale moves a logit by 0.1-1."""


def batch_invariance(
    tokenizer_path: Path,
    items: Sequence[str] | Sequence[tuple[str, str]],
    run: Runner,
    *,
    max_length: int,
    pad_id: int,
    static_length: int | None = None,
) -> dict[str, Any]:
    """Whether each item's output is the same alone as inside one batch of all ``items``
    (mixed lengths, so a short item is padded to the longest): the figure that decides if a
    graph may batch freely (``row_invariant``)."""

    def batches(size: int) -> list[CheckBatch]:
        return encode(
            tokenizer_path,
            items,
            max_length=max_length,
            pad_id=pad_id,
            batch_size=size,
            static_length=static_length,
        )

    alone = gather(batches(1), run)
    together = gather(batches(len(items)), run)
    diff = float(np.abs(alone - together).max())
    return {
        "max_abs_diff": diff,
        "atol": INVARIANCE_ATOL,
        "invariant": diff <= INVARIANCE_ATOL,
        "batch": len(items),
        "check_set": CHECK_SET_ID,
    }


def check(figures: dict[str, Any], tol: Tolerance, *, what: str) -> None:
    """Raise :class:`ModelError` when ``figures`` are outside ``tol``."""
    if figures["max_abs_diff"] > tol.atol:
        raise ModelError(
            f"{what}: max abs diff {figures['max_abs_diff']:.3g} exceeds atol {tol.atol:g} "
            f"on the check set ({figures['n']} inputs)"
        )
    if tol.min_cosine is not None and figures.get("min_cosine", 1.0) < tol.min_cosine:
        raise ModelError(
            f"{what}: min cosine {figures['min_cosine']:.6f} is below {tol.min_cosine} "
            f"on the check set ({figures['n']} inputs)"
        )
