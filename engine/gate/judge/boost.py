"""Gradient-boosted decision trees for binary labels, in NumPy alone: fit and predict.

Small and deterministic on purpose: the gate's judge has a few dozen features and some
thousands of rows, so a plain second-order boosting of shallow trees (logistic loss, Newton
leaf values with an L2 penalty, best-first growth to ``max_leaves``, split search over at most
``bins`` quantile edges per feature) fits in seconds and needs no other library. The same
inputs give the same trees: no sampling, ties broken by feature order.

A fitted :class:`Boost` is plain arrays (:meth:`Boost.to_dict` / :meth:`Boost.from_dict`), so an
artefact stores it as JSON and the gate scores with a vectorised walk down every tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

__all__ = ["Boost", "BoostSettings", "fit"]


@dataclass(frozen=True)
class BoostSettings:
    trees: int = 200
    learning_rate: float = 0.05
    max_leaves: int = 15
    min_leaf: int = 20
    """Fewest training rows in a leaf."""
    l2: float = 1.0
    """L2 penalty on leaf values (the Newton step's denominator)."""
    bins: int = 64
    """Most split points per feature (quantile edges of the training values)."""

    def __post_init__(self) -> None:
        if not (
            self.trees >= 1
            and 0 < self.learning_rate <= 1
            and self.max_leaves >= 2
            and self.min_leaf >= 1
            and self.l2 >= 0
            and 2 <= self.bins <= 255
        ):
            raise ValueError(f"invalid boosting settings: {self}")


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


def _edges(col: np.ndarray, bins: int) -> np.ndarray:
    """Candidate thresholds: midpoints between distinct quantile values."""
    values = np.unique(col)
    if len(values) > bins:
        values = np.unique(np.quantile(col, np.linspace(0, 1, bins + 1), method="nearest"))
    mids: np.ndarray = (values[:-1] + values[1:]) / 2
    return mids


def fit(x: np.ndarray, y: np.ndarray, settings: BoostSettings | None = None) -> Boost:
    """Boosted trees predicting ``y`` (0/1) from ``x`` (rows x features)."""
    s = settings or BoostSettings()
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.ndim != 2 or len(x) != len(y) or not len(x):
        raise ValueError("x must be a non-empty rows x features matrix with one label per row")
    if not np.isfinite(x).all():
        raise ValueError("features must be finite")
    if not set(np.unique(y)) <= {0.0, 1.0}:
        raise ValueError("labels must be 0 or 1")
    prior = float(np.clip(y.mean(), 1e-6, 1 - 1e-6))
    base = float(np.log(prior / (1 - prior)))
    edges = [_edges(x[:, j], s.bins) for j in range(x.shape[1])]
    # bin index of every value: row r of feature j falls in bin searchsorted(edges_j, x[r, j])
    binned = np.stack(
        [np.searchsorted(e, x[:, j], side="left") for j, e in enumerate(edges)], axis=1
    )
    nodes: dict[str, list[Any]] = {
        k: [] for k in ("feature", "threshold", "left", "right", "value")
    }
    roots = []
    margin = np.full(len(y), base)
    for _ in range(s.trees):
        p = 1.0 / (1.0 + np.exp(-margin))
        g, h = p - y, np.maximum(p * (1 - p), 1e-12)
        root, leaf_of = _grow(binned, edges, g, h, s, nodes)
        roots.append(root)
        margin += np.asarray(nodes["value"])[leaf_of]
    return Boost(
        base,
        feature=np.asarray(nodes["feature"], dtype=np.int64),
        threshold=np.asarray(nodes["threshold"], dtype=np.float64),
        left=np.asarray(nodes["left"], dtype=np.int64),
        right=np.asarray(nodes["right"], dtype=np.int64),
        value=np.asarray(nodes["value"], dtype=np.float64),
        roots=np.asarray(roots, dtype=np.int64),
        n_features=x.shape[1],
    )


def _best_split(
    binned: np.ndarray, rows: np.ndarray, g: np.ndarray, h: np.ndarray, s: BoostSettings
) -> tuple[float, int, int]:
    """(gain, feature, bin) of the best split of ``rows``; gain 0 when none is allowed. One
    histogram of every feature at once: bin ``b`` of feature ``j`` is cell ``j * width + b``."""
    gs, hs, n = g[rows].sum(), h[rows].sum(), len(rows)
    best = (0.0, -1, -1)
    if n < 2 * s.min_leaf:
        return best
    width = s.bins + 1
    features = binned.shape[1]
    cells = (binned[rows] + np.arange(features) * width).ravel()
    size = features * width
    hist_g = np.bincount(cells, weights=np.repeat(g[rows], features), minlength=size)
    hist_h = np.bincount(cells, weights=np.repeat(h[rows], features), minlength=size)
    hist_n = np.bincount(cells, minlength=size)
    # left side of a split after bin k: cumulative sums within each feature's row of bins
    cg = hist_g.reshape(features, width).cumsum(axis=1)[:, :-1]
    ch = hist_h.reshape(features, width).cumsum(axis=1)[:, :-1]
    cn = hist_n.reshape(features, width).cumsum(axis=1)[:, :-1]
    ok = (cn >= s.min_leaf) & (n - cn >= s.min_leaf)
    if not ok.any():
        return best
    parent = gs * gs / (hs + s.l2)
    gain = cg**2 / (ch + s.l2) + (gs - cg) ** 2 / (hs - ch + s.l2) - parent
    gain = np.where(ok, gain, -np.inf)
    j, k = np.unravel_index(int(np.argmax(gain)), gain.shape)  # first of equals: lowest j, k
    if gain[j, k] > 1e-12:
        best = (float(gain[j, k]), int(j), int(k))
    return best


def _grow(
    binned: np.ndarray,
    edges: list[np.ndarray],
    g: np.ndarray,
    h: np.ndarray,
    s: BoostSettings,
    nodes: dict[str, list[Any]],
) -> tuple[int, np.ndarray]:
    """Grow one tree best-first into ``nodes``; returns its root and each row's leaf."""

    def new_node(rows: np.ndarray) -> int:
        nodes["feature"].append(-1)
        nodes["threshold"].append(0.0)
        nodes["left"].append(-1)
        nodes["right"].append(-1)
        leaf = -g[rows].sum() / (h[rows].sum() + s.l2) * s.learning_rate
        nodes["value"].append(float(leaf))
        return len(nodes["feature"]) - 1

    all_rows = np.arange(len(g))
    root = new_node(all_rows)
    open_leaves = {root: (all_rows, _best_split(binned, all_rows, g, h, s))}
    leaves = 1
    while leaves < s.max_leaves:
        node = max(open_leaves, key=lambda k: (open_leaves[k][1][0], -k))
        rows, (gain, j, k) = open_leaves[node]
        if gain <= 0:
            break
        del open_leaves[node]
        go_left = binned[rows, j] <= k
        lrows, rrows = rows[go_left], rows[~go_left]
        left, right = new_node(lrows), new_node(rrows)
        nodes["feature"][node] = j
        nodes["threshold"][node] = float(edges[j][k])
        nodes["left"][node], nodes["right"][node] = left, right
        nodes["value"][node] = 0.0
        open_leaves[left] = (lrows, _best_split(binned, lrows, g, h, s))
        open_leaves[right] = (rrows, _best_split(binned, rrows, g, h, s))
        leaves += 1
    leaf_of = np.empty(len(g), dtype=np.int64)
    for leaf, (rows, _) in open_leaves.items():
        leaf_of[rows] = leaf
    return root, leaf_of
