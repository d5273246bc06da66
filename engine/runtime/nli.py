"""NLI scoring: (premise, hypothesis) pairs -> probabilities over the manifest's labels.

Works for 3-label models (contradiction / entailment / neutral, in whatever order the manifest
says) and 2-label contradiction classifiers; static-shape graphs are padded to their length.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from engine.errors import InvalidInput, ManifestMismatch
from engine.runtime.base import Prepared, TokenModel

__all__ = ["NLIScorer", "Pair"]

Pair = tuple[str, str]


def _nothing() -> None:
    pass


class NLIScorer(TokenModel[Pair]):
    task = "nli"

    def _check_outputs(self) -> None:
        manifest = self.manifest
        self.labels = manifest.labels
        self.contradiction_index = manifest.labels.index("contradiction")
        self.entailment_index = manifest.label_index("entailment")
        out = self.model.session.get_outputs()[0]
        if isinstance(out.shape[-1], int) and out.shape[-1] != len(self.labels):
            raise ManifestMismatch(
                f"{manifest.describe()}: graph has {out.shape[-1]} logits, "
                f"manifest labels {self.labels}"
            )

    def _clip_item(self, pair: Pair, count: Callable[[], None]) -> Pair:
        """Clip the far-too-long sides of a pair so that longest-first truncation keeps the
        same tokens: a clipped side keeps more than ``max_length`` tokens, and more than the
        other side has, so the longer side stays the longer. When both sides are clipped,
        which one keeps the odd token of an odd budget follows their clipped lengths."""
        if not (
            isinstance(pair, tuple) and len(pair) == 2 and all(isinstance(s, str) for s in pair)
        ):
            raise InvalidInput("NLI input must be (premise, hypothesis) string pairs")
        premise, hypothesis = pair
        clipped = [self.clip(side, _nothing) for side in pair]
        if clipped[0] is premise and clipped[1] is hypothesis:
            return pair
        if clipped[0] is not premise and clipped[1] is not hypothesis:
            count()
            count()
            return clipped[0], clipped[1]
        # One side clipped: it must keep more tokens than the other side has too. At the
        # default bar that is the clip already made, so it is not tokenised again.
        i = 0 if clipped[0] is not premise else 1
        limit = self.manifest.max_length
        need = max(limit, self.count_tokens(pair[1 - i]))
        side = clipped[i] if need == limit else self.clip(pair[i], _nothing, need)
        if side is not pair[i]:
            count()
        return (side, hypothesis) if i == 0 else (premise, side)

    def postprocess(self, outputs: list[list[np.ndarray]], prepared: Prepared) -> np.ndarray:
        probs = np.zeros((prepared.n, len(self.labels)), dtype=np.float32)
        for bucket, out in zip(prepared.buckets, outputs, strict=True):
            logits = out[0].astype(np.float32)
            logits -= logits.max(axis=1, keepdims=True)
            e = np.exp(logits)
            probs[bucket.index] = e / e.sum(axis=1, keepdims=True)
        return probs

    def score(self, pairs: Sequence[Pair]) -> np.ndarray:
        """Probabilities [n, len(labels)] for (premise, hypothesis) pairs, in their order."""
        if not pairs:
            return np.zeros((0, len(self.labels)), dtype=np.float32)
        prepared = self.preprocess(pairs)
        return self.postprocess(self.forward(prepared), prepared)

    __call__ = score

    def contradiction(self, pairs: Sequence[Pair]) -> np.ndarray:
        return self.score(pairs)[:, self.contradiction_index]

    def warmup(self) -> None:
        self.score([("warm up", "warm up")])
