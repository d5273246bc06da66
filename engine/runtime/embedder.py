"""Sentence embeddings: mean pooling over the attention mask, L2-normalised float32."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from engine.errors import InvalidInput, ManifestMismatch
from engine.runtime.base import Encoded, Prepared, TokenModel

__all__ = ["Embedder"]


class Embedder(TokenModel[str]):
    task = "embedding"

    def _check_outputs(self) -> None:
        manifest = self.manifest
        self.dim = int(manifest.embedding_dim or 0)
        out = self.model.session.get_outputs()[0]
        if self.dim and isinstance(out.shape[-1], int) and out.shape[-1] != self.dim:
            raise ManifestMismatch(
                f"{manifest.describe()}: graph width {out.shape[-1]} != "
                f"manifest embedding_dim {self.dim}"
            )

    def _clip_item(self, item: str, count: Callable[[], None]) -> str:
        if not isinstance(item, str):
            raise InvalidInput(f"embedder input must be str, got {type(item).__name__}")
        return self.clip(item, count)

    def postprocess(self, outputs: list[list[np.ndarray]], prepared: Prepared) -> np.ndarray:
        result = np.zeros((prepared.n, self.dim), dtype=np.float32)
        for bucket, out in zip(prepared.buckets, outputs, strict=True):
            hidden = out[0]
            mask = bucket.feeds["attention_mask"]
            if self.manifest.pooling == "cls":
                pooled = hidden[:, 0, :]
            else:
                m = mask[:, :, None].astype(np.float32)
                pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
            result[bucket.index] = pooled
        if self.manifest.normalize:
            norms = np.linalg.norm(result, axis=1, keepdims=True)
            result /= np.maximum(norms, 1e-12)
        return result

    def embed(
        self, texts: Sequence[str], *, encoded: Sequence[Encoded | None] | None = None
    ) -> np.ndarray:
        """Embed ``texts`` in their order: float32 [n, dim], unit length. ``encoded``
        (optional, one entry per text): texts already tokenised by :meth:`encode_items`, which
        are not tokenised again."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        prepared = self.preprocess(texts, encoded)
        return self.postprocess(self.forward(prepared), prepared)

    __call__ = embed

    def warmup(self) -> None:
        self.embed(["warm up"])
