"""Fitting the judge's gradient-boosted trees (:class:`engine.gate.judge.boost.Boost`).

Small and deterministic on purpose: the gate's judge has a few dozen features and some
thousands of rows, so a plain second-order boosting of shallow trees (logistic loss, Newton
leaf values with an L2 penalty, best-first growth to ``max_leaves``, split search over at most
``bins`` quantile edges per feature) fits in seconds and needs no other library. The same
inputs give the same trees: no sampling, ties broken by feature order. The gate only predicts;
fitting lives here, with the rest of the tuning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.gate.judge.boost import Boost

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
