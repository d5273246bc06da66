"""The runtime contract shared by the embedder and the NLI scorer.

Every model is ``preprocess -> forward -> postprocess``:

* ``preprocess`` tokenises with the fast ``tokenizers`` library, counts truncation at the model's
  max length, sorts the items by token length and cuts them into length buckets, each padded only
  to its own longest item (or to the static length a fixed-shape graph demands). A text far longer
  than the model can see is first *clipped* at a word boundary, so tokenising it costs what a
  max-length text costs (the model saw only its first ``max_length`` tokens anyway);
* ``forward`` runs the ONNX session once per bucket;
* ``postprocess`` turns raw outputs into results and restores the caller's order.

Splitting the steps lets a batcher tokenise batch n+1 while batch n is in the model.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Generic, Literal, TypeVar

import numpy as np
from tokenizers import Encoding, Tokenizer

from engine.errors import InvalidInput, ManifestMismatch, ModelError
from engine.runtime.manifest import Manifest
from engine.runtime.session import OrtModel, SessionSettings

__all__ = [
    "CLIP_CHARS_PER_TOKEN",
    "BatchSettings",
    "Bucket",
    "Encoded",
    "Prepared",
    "RunStats",
    "TokenModel",
    "batch_invariant",
    "plan_passes",
]

Item = TypeVar("Item")

_BLANKS = " \t\n\r"
"""Where a text may be clipped: every tokenizer here splits words at these (a rarer Unicode
space may be dropped or joined by a normaliser, so it is never a cut point)."""

CLIP_CHARS_PER_TOKEN = 8
"""A text longer than ``max_length x this`` characters is clipped before tokenising. English
averages 4-6 characters per token; a clipped prefix is kept only when it still holds more than
``max_length`` tokens, so the tokens the model sees are the same either way."""


@dataclass(frozen=True)
class BatchSettings:
    """How one call is cut into model batches."""

    max_batch: int = 32
    """Most items per forward pass."""
    max_batch_tokens: int = 8192
    """Most padded tokens per forward pass (items x padded length)."""
    length_split: bool = True
    """Cut a length-sorted call into forward passes where they cost least under the pass cost
    model below (:func:`plan_passes`), so a few short items are not padded to a long
    neighbour's length. ``False``: the greedy cut (fill each pass to ``max_batch`` in length
    order), the behaviour before; kept for benchmarks."""
    pass_overhead_tokens: int = 48
    """Fixed cost of one forward pass, in padded short tokens (the cost model's unit). Two fits
    on a 2-core Intel Xeon (aegis-nli int8, passes of 1-16 rows x 16-160 tokens, best of 3 and
    of 7, load average 1.4-3): ``t = a + b n w (1 + w / c)`` with a = 6.8-6.9 ms, b = 134-211
    us, c = 94-132, so a pass costs 33-50 tokens; the upper end is taken (a split must pay
    clearly: fewer passes where the fit is unsure)."""
    attention_tokens: int = 128
    """Width at which a padded token costs twice a short one (attention's length-squared term;
    the same fits: 94-132 for the NLI model. MiniLM fits ~1,400, a smaller term, so its passes
    are split a little more eagerly than its own fit would: it is ~6% of the model time)."""
    row_invariant: Literal["auto", "on", "off"] = "auto"
    """Run one item per forward pass so that no item's result depends on what else is in the
    batch. Dynamically quantised (int8) graphs scale activations per *tensor*: batched, one
    pair's contradiction moved by up to 0.77 with its batch-mates and ~10% of dev pairs crossed
    a policy threshold. Blockwise int8 graphs quantise each row on its own and batch freely.
    ``auto`` = on for quantised models, unless the manifest records that the graph was measured
    batch-invariant (:func:`batch_invariant`)."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch <= 4096:
            raise InvalidInput(f"max_batch must be in [1, 4096], got {self.max_batch}")
        if not 16 <= self.max_batch_tokens <= 1 << 22:
            raise InvalidInput(
                f"max_batch_tokens must be in [16, 4194304], got {self.max_batch_tokens}"
            )
        if not 0 <= self.pass_overhead_tokens <= 1 << 20:
            raise InvalidInput(
                f"pass_overhead_tokens must be in [0, 1048576], got {self.pass_overhead_tokens}"
            )
        if not 1 <= self.attention_tokens <= 1 << 20:
            raise InvalidInput(
                f"attention_tokens must be in [1, 1048576], got {self.attention_tokens}"
            )
        if self.row_invariant not in ("auto", "on", "off"):
            raise InvalidInput("row_invariant must be auto, on or off")


@dataclass
class RunStats:
    """What one call cost; summed across calls by :meth:`TokenModel.totals`."""

    items: int = 0
    truncated: int = 0
    """Items cut at the model's max length (their tail was not seen by the model)."""
    clipped: int = 0
    """Items (texts, or sides of a pair) cut by characters before tokenising: far longer than
    the model's max length. Each is also counted in ``truncated``."""
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


@dataclass(frozen=True, slots=True)
class Encoded:
    """One item tokenised for the model, made once where the batch budget counts tokens and
    handed on to the model call (:meth:`TokenModel.tokenize`), which does not tokenise the
    item again: TEI's queue entries carry their encodings the same way."""

    encoding: Encoding
    tokens: int
    """Tokens after truncation (special tokens included): what the token budget counts."""
    clipped: int = 0
    """Texts of this item cut by characters before tokenising (:meth:`TokenModel.clip`)."""


def plan_passes(
    widths: Sequence[int],
    max_items: int,
    max_tokens: int,
    overhead: int = 48,
    attention: int = 128,
) -> list[int]:
    """Where to cut items sorted by padded width (ascending) into forward passes: the end
    index of each pass, in order. Each pass holds at most ``max_items`` items and
    ``max_tokens`` padded tokens (an item alone may exceed it: it goes alone), and is padded to
    its last (longest) item's width ``w``. The cut minimises the total cost, a pass costing

        overhead + n x w x (1 + w / attention)

    (a fixed per-pass cost plus its padded tokens, a long one dearer: attention grows with the
    square of the width). So a pass is split at a length jump exactly where padding its short
    items to the long width costs more than one more pass. Among equal costs the longest first
    pass wins, so items of one width are cut as the greedy fill cuts them. Exact (integer)
    dynamic programme, O(len x max_items)."""
    n = len(widths)
    # best[i]: the least cost of items i..n-1, times ``attention`` (integers: ties are exact);
    # cut[i]: where the first pass of that plan ends.
    best = [0] * (n + 1)
    cut = [n] * (n + 1)
    fixed = overhead * attention
    for i in range(n - 1, -1, -1):
        top = min(n, i + max_items)
        cost, end = fixed + widths[i] * (attention + widths[i]) + best[i + 1], i + 1
        for e in range(i + 2, top + 1):
            w = widths[e - 1]
            k = e - i
            if k * w > max_tokens:
                break  # widths only grow: every longer pass is over budget too
            c = fixed + k * w * (attention + w) + best[e]
            if c <= cost:
                cost, end = c, e
        best[i], cut[i] = cost, end
    ends: list[int] = []
    i = 0
    while i < n:
        i = cut[i]
        ends.append(i)
    return ends


def batch_invariant(manifest: Manifest) -> bool:
    """Whether a graph's rows are independent of their batch-mates: unquantised graphs are, a
    quantised one only when its build measured it (``batch_invariance.invariant``)."""
    if not manifest.extra.get("quantization"):
        return True
    record = manifest.extra.get("batch_invariance")
    return isinstance(record, dict) and record.get("invariant") is True


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
        self.clip_chars = manifest.max_length * CLIP_CHARS_PER_TOKEN
        pad = self.tokenizer.token_to_id("[PAD]")
        self.pad_id = 0 if pad is None else pad
        self.totals = RunStats()
        mode = self.batching.row_invariant
        self.row_invariant = mode == "on" or (mode == "auto" and not batch_invariant(manifest))
        self.max_batch = 1 if self.row_invariant else self.batching.max_batch
        self._check_outputs()
        self._check_max_length()

    def _check_outputs(self) -> None:
        """Subclasses check the graph's outputs against the manifest."""

    def _check_max_length(self) -> None:
        """The graph takes inputs of the manifest's max length: a static graph declares exactly
        that width, and one forward pass at that width runs. A max length the model cannot take
        (a tampered manifest, a graph whose position table is shorter) is refused at start, not
        on the first long text."""
        m = self.manifest
        width = m.static_length or m.max_length
        declared = self.model.input_shapes.get("input_ids", ())
        if m.static_length is not None and declared and declared[-1] != m.static_length:
            raise ManifestMismatch(
                f"{m.describe()}: the graph takes inputs of width {declared[-1]}, "
                f"the manifest says static_length {m.static_length}"
            )
        ids = np.full((1, width), self.pad_id, dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": ids * 0}
        try:
            self.model.run(feeds, quiet=True)
        except ModelError as exc:
            raise ManifestMismatch(
                f"{m.describe()}: the graph does not take inputs of the manifest's max_length "
                f"{width} ({exc})"
            ) from exc

    # -- contract -------------------------------------------------------------------------
    def encode(self, items: Sequence[Item]) -> list[Encoding]:
        """Tokenise ``items`` (truncated at the model's max length)."""
        return self._encode(items)[0]

    def tokenize(
        self, items: Sequence[Item], encoded: Sequence[Encoded | None] | None = None
    ) -> tuple[list[Encoding], int]:
        """The encodings of ``items`` and how many were clipped first: the first half of
        :meth:`preprocess`, which a model stage runs on the caller's thread. ``encoded``
        (optional, one entry per item): items already tokenised by :meth:`encode_items` (for
        a batch budget), taken as they are; only the items without one are tokenised."""
        if encoded is None:
            return self._encode(items)
        if len(encoded) != len(items):
            raise InvalidInput(f"{len(encoded)} encodings for {len(items)} items")
        todo = [i for i, e in enumerate(encoded) if e is None]
        fresh, clipped = self._encode([items[i] for i in todo]) if todo else ([], 0)
        out: list[Encoding | None] = [None if e is None else e.encoding for e in encoded]
        for i, enc in zip(todo, fresh, strict=True):
            out[i] = enc
        clipped += sum(e.clipped for e in encoded if e is not None)
        return [e for e in out if e is not None], clipped

    def encode_items(self, items: Sequence[Item]) -> list[Encoded]:
        """Tokenise ``items`` once, for a batch budget and then for the model: each item's
        encoding with its token count (after truncation) and its clip count. Hand them back to
        :meth:`tokenize` (through ``embed(texts, encoded=...)``) and nothing is tokenised
        twice."""
        clips: list[int] = []

        def count() -> None:
            clips[-1] += 1

        inputs = []
        for item in items:
            clips.append(0)
            inputs.append(self._clip_item(item, count))
        encodings = self.tokenizer.encode_batch(inputs, add_special_tokens=True)
        return [
            Encoded(enc, len(enc.ids), clip) for enc, clip in zip(encodings, clips, strict=True)
        ]

    def _encode(self, items: Sequence[Item]) -> tuple[list[Encoding], int]:
        """The encodings, and how many texts were clipped first."""
        encoded = self.encode_items(items)
        return [e.encoding for e in encoded], sum(e.clipped for e in encoded)

    def _clip_item(self, item: Item, count: Callable[[], None]) -> str | tuple[str, str]:
        """One item, validated (``InvalidInput``), with its text(s) passed through
        :meth:`clip`; what the tokenizer is given. Subclasses implement it."""
        raise NotImplementedError

    def clip(self, text: str, count: Callable[[], None], more_than: int | None = None) -> str:
        """``text``, or a prefix of it, cut just before a run of blanks, that still holds more
        than ``more_than`` tokens (default: ``max_length``): tokenising a 100x longer text then
        costs about what a max-length one does, and the model sees the same tokens (the
        tokenizers split words at blanks, so the prefix's tokens are the first tokens of the
        whole text). ``count()`` is called when it clips.

        The prefix starts at ``max_length x CLIP_CHARS_PER_TOKEN`` characters and grows 4x
        while it holds too few tokens (text padded with blanks or characters the tokenizer
        drops), so no text costs more than about 4/3 of tokenising it whole. A word longer
        than the window is never cut (sub-word segmentation depends on the whole word)."""
        need = self.manifest.max_length if more_than is None else more_than
        size = self.clip_chars
        while len(text) > size:
            # Cut where the last run of blanks in the window begins (string scans, no regex:
            # a crafted text must not make the cut itself expensive).
            last = max(text.rfind(b, 0, size) for b in _BLANKS)
            end = len(text[:last].rstrip(_BLANKS)) if last > 0 else 0
            if end == 0:  # one huge word: end the prefix after it
                later = [i for i in (text.find(b, size) for b in _BLANKS) if i >= 0]
                if not later:
                    return text
                end = len(text[: min(later)].rstrip(_BLANKS))
            prefix = text[:end]
            if end > 0 and self.count_tokens(prefix) > need:
                count()
                return prefix
            size = max(size * 4, end + 1)
        return text

    def count_tokens(self, text: str) -> int:
        """Tokens in ``text`` without special tokens, however many (not truncated)."""
        enc = self.tokenizer.encode(text, add_special_tokens=False)
        return len(enc.ids) + sum(len(o.ids) for o in enc.overflowing)

    def token_lengths(self, items: Sequence[Item]) -> list[int]:
        """Token counts after truncation: what a batcher's token budget is measured in."""
        return [len(e.ids) for e in self.encode(items)]

    def preprocess(
        self, items: Sequence[Item], encoded: Sequence[Encoded | None] | None = None
    ) -> Prepared:
        """Tokenise (the items without an entry in ``encoded``), then :meth:`bucket`."""
        t0 = time.perf_counter()
        encodings, clipped = self.tokenize(items, encoded)
        return self.bucket(encodings, clipped=clipped, tokenize_s=time.perf_counter() - t0)

    def bucket(
        self, encodings: Sequence[Encoding], *, clipped: int = 0, tokenize_s: float = 0.0
    ) -> Prepared:
        """Sort tokenised items by length and cut them into padded forward passes of at most
        ``max_batch`` items and ``max_batch_tokens`` padded tokens, split at a length jump
        where that costs less (:func:`plan_passes`; the second half of :meth:`preprocess`; a
        model stage merges several callers' encodings here)."""
        t0 = time.perf_counter()
        encodings = list(encodings)
        stats = RunStats(items=len(encodings), clipped=clipped)
        lengths = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        stats.truncated = sum(1 for e in encodings if e.overflowing)
        stats.real_tokens = int(lengths.sum())
        order = np.argsort(lengths, kind="stable")
        static = self.manifest.static_length
        buckets: list[Bucket] = []
        for index in self._passes(order, lengths, static):
            width = static or int(lengths[index[-1]])
            buckets.append(
                Bucket(index=index, feeds=self._pad([encodings[i] for i in index], width))
            )
            stats.padded_tokens += len(index) * width
        stats.batches = len(buckets)
        stats.tokenize_s = tokenize_s + time.perf_counter() - t0
        return Prepared(n=len(encodings), buckets=buckets, stats=stats)

    def _passes(
        self, order: np.ndarray, lengths: np.ndarray, static: int | None
    ) -> list[np.ndarray]:
        """``order`` (positions sorted by length) cut into forward passes."""
        b = self.batching
        if b.length_split and self.max_batch > 1:
            widths = [static or int(x) for x in lengths[order]]
            ends = plan_passes(
                widths,
                self.max_batch,
                b.max_batch_tokens,
                b.pass_overhead_tokens,
                b.attention_tokens,
            )
            starts = [0, *ends[:-1]]
            return [order[a:e] for a, e in zip(starts, ends, strict=True)]
        out: list[np.ndarray] = []
        start = 0
        while start < len(order):
            # Greedy: grow the pass while the padded size (count x longest) stays in budget.
            end = start + 1
            while end < len(order) and end - start < self.max_batch:
                width = static or int(lengths[order[end]])
                if (end - start + 1) * width > b.max_batch_tokens:
                    break
                end += 1
            out.append(order[start:end])
            start = end
        return out

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
