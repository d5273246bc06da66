"""Narrow DeBERTa's relative-position attention to the distances a batch can have.

DeBERTa-v2/v3 (disentangled attention) scores every query token against ``2 * span`` relative
position embeddings per layer and head (``span`` = ``position_buckets``, 256 for
nli-deberta-v3-small and aegis' DeBERTa-v3-xsmall), tiles those embeddings over the batch, and
then *gathers* the ``L x L`` entries it needs (``c2p`` and ``p2c``). A batch padded to ``L``
tokens only ever gathers buckets ``span - (L - 1) ... span + (L - 1)``: a distance ``d`` falls
in a bucket no further out than ``d`` (linear up to ``position_buckets / 2``, logarithmic
beyond). So for a 32-token batch, 448 of the 512 rows are tiled over the batch and multiplied
with every query and key for nothing (their projections are constants, which ONNX Runtime folds
once per session).

:func:`narrow_relative_span` rewrites an exported graph so that each of those products reads
only the ``2 * W`` rows around the centre, ``W = min(L, span)``, and shifts the gather indices
by ``span - W``. Each kept entry is the same dot product over the same ``d_head`` values, so
the scores do not change (measured: bit-identical logits; the builder checks every variant
against PyTorch as before). The batch is unchanged as a unit: ``W`` depends only on the padded
length, and a row's scores do not depend on which rows share its batch.

The pattern matched, per attention (the graph optimum's exporter writes for transformers'
``DisentangledSelfAttention`` with ``share_att_key``, before and after int8 rewrites)::

    Reshape([-1, 2*span, d]) -> Expand -> Tile -> Transpose([0, 2, 1]) -> MatMul -> GatherElements
                                                                         index: the positions

A graph without it (BERT, MiniLM) is written out unchanged with ``narrowed`` 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.errors import ModelError
from engine.pipeline.graph import read, wiring

__all__ = ["PREFIX", "narrow_relative_span"]

PREFIX = "memgate_span/"
"""Names of every node, tensor and initialiser the rewrite adds start with it."""


def narrow_relative_span(model_in: Path, model_out: Path) -> dict[str, Any]:
    """Write ``model_in`` to ``model_out`` with every matched relative-position product narrowed
    to the padded length (see the module's docstring). Returns ``{"method", "span", "narrowed",
    "left"}``: ``left`` counts ``GatherElements`` nodes that did not match the pattern."""
    import numpy as np
    from onnx import helper, numpy_helper

    model = read(model_in)
    g = model.graph
    producer, consumers, constant = wiring(g)

    def made_by(name: str, op: str) -> Any | None:
        node = producer.get(name)
        return node if node is not None and node.op_type == op else None

    matches: list[tuple[Any, Any, Any]] = []  # (GatherElements, Expand, Reshape)
    spans: set[int] = set()
    left = 0
    for ge in g.node:
        if ge.op_type != "GatherElements":
            continue
        mm = made_by(ge.input[0], "MatMul")
        tr = made_by(mm.input[1], "Transpose") if mm is not None else None
        perm = [list(a.ints) for a in tr.attribute if a.name == "perm"] if tr is not None else []
        tile = made_by(tr.input[0], "Tile") if tr is not None and perm == [[0, 2, 1]] else None
        ex = made_by(tile.input[0], "Expand") if tile is not None else None
        rs = made_by(ex.input[0], "Reshape") if ex is not None else None
        shape = constant(rs.input[1]) if rs is not None else None
        if (
            rs is None
            or shape is None
            or shape.shape != (3,)
            or shape[1] <= 0
            or shape[1] % 2
            or len(consumers.get(rs.output[0], [])) != 1
        ):
            left += 1
            continue
        spans.add(int(shape[1]) // 2)
        matches.append((ge, ex, rs))
    ids = next((i.name for i in g.input if i.name == "input_ids"), None)
    if len(spans) > 1:
        raise ModelError(f"{Path(model_in).name}: relative spans differ between layers: {spans}")
    if not matches or ids is None:
        _save(model, model_out)
        return {"method": "none", "span": None, "narrowed": 0, "left": left}
    span = spans.pop()

    def int64(name: str, values: list[int]) -> str:
        g.initializer.append(numpy_helper.from_array(np.asarray(values, np.int64), PREFIX + name))
        return PREFIX + name

    p = PREFIX
    head = [
        helper.make_node("Shape", [ids], [p + "ids_shape"]),
        helper.make_node("Gather", [p + "ids_shape", int64("one", [1])], [p + "length"], axis=0),
        helper.make_node("Min", [p + "length", int64("span", [span])], [p + "width"]),
        helper.make_node("Sub", [p + "span", p + "width"], [p + "start"]),
        helper.make_node("Add", [p + "span", p + "width"], [p + "end"]),
    ]
    axis = int64("axis", [1])
    before: dict[int, list[Any]] = {}  # id(node) -> nodes to insert right before it
    for k, (ge, ex, rs) in enumerate(matches):
        rows = f"{p}{k}/rows"
        before.setdefault(id(ex), []).append(
            helper.make_node("Slice", [rs.output[0], p + "start", p + "end", axis], [rows])
        )
        ex.input[0] = rows
        index = f"{p}{k}/index"
        before.setdefault(id(ge), []).append(
            helper.make_node("Sub", [ge.input[1], p + "start"], [index])
        )
        ge.input[1] = index
    nodes = list(head)
    for n in g.node:
        nodes.extend(before.get(id(n), []))
        nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    _save(model, model_out)
    return {
        "method": "narrowed to the padded length",
        "span": span,
        "narrowed": len(matches),
        "left": left,
    }


def _save(model: Any, path: Path) -> None:
    import onnx

    try:
        onnx.save(model, str(path))
    except Exception as exc:  # onnx raises untyped errors
        raise ModelError(f"cannot write {Path(path).name}: {exc}") from exc
