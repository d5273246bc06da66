"""The runtime contract shared by the embedder and the NLI scorer.

Every model is ``preprocess -> forward -> postprocess``:

* ``preprocess`` tokenises with the fast ``tokenizers`` library, counts truncation at the model's
  max length, sorts the items by token length and cuts them into length buckets, each padded only
  to its own longest item (or to the static length a fixed-shape graph demands);
* ``forward`` runs the ONNX session once per bucket;
* ``postprocess`` turns raw outputs into results and restores the caller's order.

Splitting the steps lets a batcher tokenise batch n+1 while batch n is in the model.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Generic, Literal, TypeVar

import numpy as np
from tokenizers import Encoding, Tokenizer

from engine.errors import InvalidInput, ManifestMismatch
from engine.runtime.manifest import Manifest
from engine.runtime.session import OrtModel, SessionSettings

__all__ = ["BatchSettings", "Bucket", "Prepared", "RunStats", "TokenModel"]

Item = TypeVar("Item")


@dataclass(frozen=True)
class BatchSettings:
    """How one call is cut into model batches."""

    max_batch: int = 32
    """Most items per forward pass."""
    max_batch_tokens: int = 8192
    """Most padded tokens per forward pass (items x padded length)."""
    row_invariant: Literal["auto", "on", "off"] = "auto"
    """Run one item per forward pass so that no item's result depends on what else is in the
    batch. Dynamically quantised (int8) graphs scale activations per *tensor*: batched, one
    pair's contradiction moved by up to 0.57 with its batch-mates and 2-3% of pairs crossed the
    0.95 threshold. ``auto`` = on for models whose manifest records quantisation."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch <= 4096:
            raise InvalidInput(f"max_batch must be in [1, 4096], got {self.max_batch}")
        if not 16 <= self.max_batch_tokens <= 1 << 22:
            raise InvalidInput(
                f"max_batch_tokens must be in [16, 4194304], got {self.max_batch_tokens}"
            )
        if self.row_invariant not in ("auto", "on", "off"):
            raise InvalidInput("row_invariant must be auto, on or off")


@dataclass
class RunStats:
    """What one call cost; summed across calls by :meth:`TokenModel.totals`."""

    items: int = 0
    truncated: int = 0
    """Items cut at the model's max length (their tail was not seen by the model)."""
    real_tokens: int = 0
    padded_tokens: int = 0
    batches: int = 0
    tokenize_s: float = 0.0
    forward_s: float = 0.0

    def add(self, other: RunStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass
class Bucket:
    index: np.ndarray
    """Positions of this bucket's items in the caller's order."""
    feeds: dict[str, np.ndarray]


@dataclass
class Prepared:
    n: int
    buckets: list[Bucket]
    stats: RunStats = field(default_factory=RunStats)


class TokenModel(Generic[Item]):
    """Tokeniser + session + bucketing; subclasses add the model-specific postprocess."""

    task: ClassVar[str] = ""
    """The manifest task this runtime serves; any other artefact is refused."""

    def __init__(
        self,
        manifest: Manifest,
        session: SessionSettings | None = None,
        batching: BatchSettings | None = None,
    ) -> None:
        if manifest.task != self.task:
            raise ManifestMismatch(f"{manifest.describe()} is not a {self.task} model")
        self.manifest = manifest
        self.batching = batching or BatchSettings()
        self.model = OrtModel(manifest.model_path, session or SessionSettings())
        missing = {"input_ids", "attention_mask"} - set(self.model.input_names)
        if missing:
            raise ManifestMismatch(f"{manifest.describe()}: graph lacks inputs {sorted(missing)}")
        self.tokenizer = Tokenizer.from_file(str(manifest.tokenizer_path))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(manifest.max_length)
        pad = self.tokenizer.token_to_id("[PAD]")
        self.pad_id = 0 if pad is None else pad
        self.totals = RunStats()
        quantised = bool(manifest.extra.get("quantization"))
        mode = self.batching.row_invariant
        self.row_invariant = mode == "on" or (mode == "auto" and quantised)
        self.max_batch = 1 if self.row_invariant else self.batching.max_batch
        self._check_outputs()

    def _check_outputs(self) -> None:
        """Subclasses check the graph's outputs against the manifest."""

    # -- contract -------------------------------------------------------------------------
    def encode(self, items: Sequence[Item]) -> list[Encoding]:
        raise NotImplementedError

    def token_lengths(self, items: Sequence[Item]) -> list[int]:
        """Token counts after truncation: what a batcher's token budget is measured in."""
        return [len(e.ids) for e in self.encode(items)]

    def preprocess(self, items: Sequence[Item]) -> Prepared:
        t0 = time.perf_counter()
        encodings = self.encode(items)
        stats = RunStats(items=len(encodings))
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        stats.truncated = sum(1 for e in encodings if e.overflowing)
        stats.real_tokens = int(lengths.sum())
        order = np.argsort(lengths, kind="stable")
        static = self.manifest.static_length
        buckets: list[Bucket] = []
        start = 0
        while start < len(order):
            # Grow the bucket while the padded size (count x longest) stays in budget.
            end = start + 1
            while end < len(order) and end - start < self.max_batch:
                width = static or int(lengths[order[end]])
                if (end - start + 1) * width > self.batching.max_batch_tokens:
                    break
                end += 1
            index = order[start:end]
            width = static or int(lengths[index[-1]])
            buckets.append(
                Bucket(index=index, feeds=self._pad([encodings[i] for i in index], width))
            )
            stats.padded_tokens += len(index) * width
            start = end
        stats.batches = len(buckets)
        stats.tokenize_s = time.perf_counter() - t0
        return Prepared(n=len(encodings), buckets=buckets, stats=stats)

    def _pad(self, encodings: list[Encoding], width: int) -> dict[str, np.ndarray]:
        ids = np.full((len(encodings), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(encodings), width), dtype=np.int64)
        types = np.zeros((len(encodings), width), dtype=np.int64)
        for row, enc in enumerate(encodings):
            n = len(enc.ids)
            ids[row, :n] = enc.ids
            mask[row, :n] = 1
            types[row, :n] = enc.type_ids
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}

    def forward(self, prepared: Prepared) -> list[list[np.ndarray]]:
        t0 = time.perf_counter()
        outputs = [self.model.run(b.feeds) for b in prepared.buckets]
        prepared.stats.forward_s = time.perf_counter() - t0
        self.totals.add(prepared.stats)
        return outputs

    def warmup(self) -> None:
        """One forward pass so the first real call does not pay for lazy initialisation."""
        raise NotImplementedError
