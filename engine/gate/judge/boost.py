"""Gradient-boosted decision trees for binary labels, in NumPy alone: the judge's predictor.

A fitted :class:`Boost` (:func:`engine.tuning.boost.fit`) is plain arrays
(:meth:`Boost.to_dict` / :meth:`Boost.from_dict`), so an artefact stores it as JSON and the gate
scores with a vectorised walk down every tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

__all__ = ["Boost"]


@dataclass(frozen=True)
class Boost:
    """Trees as flat arrays, one row per node. A split node sends a row left when its feature
    is at most ``threshold``; a leaf (``feature == -1``) holds its value."""

    base: float
    """Log-odds every row starts from (the training prior)."""
    feature: np.ndarray
    threshold: np.ndarray
    left: np.ndarray
    right: np.ndarray
    value: np.ndarray
    roots: np.ndarray
    """Index of each tree's root node."""
    n_features: int

    def margin(self, x: np.ndarray) -> np.ndarray:
        """Log-odds per row of ``x`` (rows x ``n_features``): every row down every tree at
        once, one level per step (a few hundred microseconds for a fact's candidates)."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise ValueError(f"expected rows of {self.n_features} features, got {x.shape}")
        out = np.full(len(x), self.base)
        if not len(x):
            return out
        node = np.broadcast_to(self.roots, (len(x), len(self.roots))).copy()
        rows = np.arange(len(x))[:, None]
        for _ in range(self.depth):
            f = self.feature[node]
            inner = f >= 0
            if not inner.any():
                break
            go_left = x[rows, np.where(inner, f, 0)] <= self.threshold[node]
            node = np.where(inner, np.where(go_left, self.left[node], self.right[node]), node)
        summed: np.ndarray = out + self.value[node].sum(axis=1)
        return summed

    @cached_property
    def depth(self) -> int:
        """Splits on the longest path from a root to a leaf."""
        deepest = np.zeros(len(self.feature), dtype=np.int64)
        for i in range(len(self.feature) - 1, -1, -1):  # children come after their parent
            if self.feature[i] >= 0:
                deepest[i] = 1 + max(deepest[self.left[i]], deepest[self.right[i]])
        return int(deepest[self.roots].max()) if len(self.roots) else 0

    def probability(self, x: np.ndarray) -> np.ndarray:
        p: np.ndarray = 1.0 / (1.0 + np.exp(-self.margin(x)))
        return p

    def to_dict(self) -> dict[str, Any]:
        return {
            "base": self.base,
            "n_features": self.n_features,
            "feature": self.feature.tolist(),
            "threshold": self.threshold.tolist(),
            "left": self.left.tolist(),
            "right": self.right.tolist(),
            "value": self.value.tolist(),
            "roots": self.roots.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Boost:
        n = len(d["feature"])
        arrays = {
            "feature": np.asarray(d["feature"], dtype=np.int64),
            "threshold": np.asarray(d["threshold"], dtype=np.float64),
            "left": np.asarray(d["left"], dtype=np.int64),
            "right": np.asarray(d["right"], dtype=np.int64),
            "value": np.asarray(d["value"], dtype=np.float64),
        }
        if any(len(a) != n for a in arrays.values()):
            raise ValueError("tree arrays of unequal length")
        roots = np.asarray(d["roots"], dtype=np.int64)
        nf = int(d["n_features"])
        inner = arrays["feature"] >= 0
        if (
            (roots < 0).any()
            or (roots >= n).any()
            or (arrays["feature"] >= nf).any()
            or (arrays["left"][inner] <= np.flatnonzero(inner)).any()  # children come later:
            or (arrays["right"][inner] <= np.flatnonzero(inner)).any()  # no cycle can hang
            or (arrays["left"][inner] >= n).any()
            or (arrays["right"][inner] >= n).any()
        ):
            raise ValueError("malformed trees")
        return cls(float(d["base"]), roots=roots, n_features=nf, **arrays)
