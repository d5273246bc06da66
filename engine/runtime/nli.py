"""NLI scoring: (premise, hypothesis) pairs -> probabilities over the manifest's labels.

Works for 3-label models (contradiction / entailment / neutral, in whatever order the manifest
says) and 2-label contradiction classifiers; static-shape graphs are padded to their length.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tokenizers import Encoding

from engine.errors import InvalidInput, ManifestMismatch
from engine.runtime.base import Prepared, TokenModel

__all__ = ["NLIScorer", "Pair"]

Pair = tuple[str, str]


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

    def encode(self, items: Sequence[Pair]) -> list[Encoding]:
        pairs = []
        for item in items:
            if not (
                isinstance(item, tuple) and len(item) == 2 and all(isinstance(s, str) for s in item)
            ):
                raise InvalidInput("NLI input must be (premise, hypothesis) string pairs")
            pairs.append(item)
        return list(self.tokenizer.encode_batch(pairs, add_special_tokens=True))

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
