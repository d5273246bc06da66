"""Trim the non-GEMM work out of an exported DeBERTa graph, without changing what it computes.

Profile that motivated it (ONNX Runtime, nli-deberta-v3-small rowwise int8, one 32-pair call of
57 tokens, 2 threads): the int8 GEMMs were 21% of a forward; the Transpose / Tile / Expand /
GatherElements / Sub chains of the relative-position attention, the rowwise quantisers' ``Abs``
and the attention-scale divisions together about a quarter. :func:`trim_graph` applies up to
three rewrites, each matched on the graph optimum's exporter writes for transformers'
``DisentangledSelfAttention`` (``share_att_key``) and on the quantised graphs derived from it:

1. **Relative-position scores without tiling or expanding** (``relative``). The export computes
   each layer's content-to-position (c2p) and position-to-content (p2c) term as::

       rows [H, 2W, d] -> Expand -> Tile (over the batch: [B*H, 2W, d]) -> Transpose([0, 2, 1])
       MatMul(X [B*H, L, d], that) -> GatherElements(index Expand(pos [L, L]) -> [B*H, L, L])
       -> (p2c) Transpose([0, 2, 1]) -> Div(scale)

   The rows are the same for every row of the batch and the index depends only on the padded
   length ``L``, yet both are materialised ``B*H`` times per layer and call (and the span
   narrowing's index shift runs over the ``[B*H, L, L]`` index). Rewritten as::

       c2p: FusedMatMul(Reshape(X, [-1, H, L, d]), rows, transB)  -> [B, H, L, 2W]
            -> GatherElements(axis 2, INDEX)
       p2c: FusedMatMul(rows, Reshape(X, [-1, H, L, d]), transB)  -> [B, H, 2W, L]
            -> GatherElements(axis 1, INDEX_T)      (gathering rows: no Transpose after it)

   Both products broadcast the ``[H, 2W, d]`` rows over the batch instead of tiling them.
   ``INDEX`` is ``pos - shift`` expanded to ``[B*H, L, L]`` once per distinct position tensor
   (the exporter's c2p position tensor is shared by all layers; ``INDEX_T`` uses its
   transpose). The divisions by the attention scale stay where they were.
2. **Row maxima without an ``Abs`` copy** (``absmax``): the rowwise int8 quantisers'
   ``ReduceMax(Abs(x))`` becomes ``Max(ReduceMax(x), Neg(ReduceMin(x)))``, bit-identical and
   without writing ``|x|`` (the FFN activations are the largest tensors of a forward).
3. **The attention scale on the product** (``scale``, off unless ``scales=True``):
   ``MatMul(Q, Div(Transpose(K), s))`` becomes ``FusedMatMul(Q, K, transB=1, alpha=1/s)`` when
   ``s`` is a constant scalar (found by running the graph at two input shapes), and the c2p /
   p2c divisions move onto the relative-position rows. This changes float rounding (fp32 logits
   within 4e-7), and an int8 graph re-rounds each row's activations, so one last bit can move
   a quantisation step: on aegis-nli int8 it moved a check-set logit by 0.08 and flipped one
   decision at 0.5. So the pipeline does not use it; it saves about 2% of a forward.

With the defaults every score is the same dot product over the same values in the same order:
the trimmed graphs score bit-identically to the untrimmed ones (measured on the NLI and aegis
int8 graphs at lengths 1 to 512). The builder runs both graphs on the check set, records the
difference and the decisions, and publishes the untrimmed graph if anything moved
(:func:`engine.pipeline._common._trim`). No row's result depends on another row of its batch,
before or after.

A graph without the patterns (BERT, MiniLM) is written out unchanged, every count 0.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.errors import ModelError
from engine.pipeline.graph import _node_inputs, prune, read, wiring

__all__ = ["PREFIX", "TRIM_METHOD", "trim_graph"]

PREFIX = "memgate_trim/"
"""Names of every node, tensor and initialiser the rewrites add start with it."""

TRIM_METHOD = "memgate.pipeline.trim.trim_graph (relative, scale, absmax)"


def _perm(node: Any) -> list[int] | None:
    for a in node.attribute:
        if a.name == "perm":
            return list(a.ints)
    return None


class _Edit:
    """Insertions, removals and renames over one graph, applied at once (then the graph is
    sorted topologically and pruned of what no longer feeds an output)."""

    def __init__(self, g: Any) -> None:
        self.g = g
        self.producer, self.consumers, self.constant = wiring(g)
        self.before: dict[int, list[Any]] = {}
        self.dead: set[int] = set()
        self.renamed: dict[str, str] = {}
        self.inits: dict[str, Any] = {}

    def made_by(self, name: str, op: str) -> Any | None:
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op else None

    def only(self, name: str, op: str) -> Any | None:
        after = self.consumers.get(name, [])
        return after[0] if len(after) == 1 and after[0].op_type == op else None

    def const(self, name: str, value: Any) -> str:
        import numpy as np
        from onnx import numpy_helper

        full = PREFIX + name
        if full not in self.inits:
            self.inits[full] = numpy_helper.from_array(np.asarray(value), full)
        return full

    def insert(self, at: Any, nodes: list[Any]) -> None:
        for n in nodes:
            if not n.name:
                n.name = n.output[0]
        self.before.setdefault(id(at), []).extend(nodes)

    def apply(self) -> None:
        g = self.g
        outputs = {o.name for o in g.output}
        if outputs & set(self.renamed):
            raise ModelError(f"a trimmed tensor is a graph output: {outputs & set(self.renamed)}")
        for n in g.node:
            for i, name in enumerate(n.input):
                if name in self.renamed:
                    n.input[i] = self.renamed[name]
        nodes: list[Any] = []
        for n in g.node:
            nodes.extend(self.before.get(id(n), []))
            if id(n) not in self.dead:
                nodes.append(n)
        prune(g, _topological(nodes), list(self.inits.values()))


def _topological(nodes: list[Any]) -> list[Any]:
    """``nodes`` in an order where each comes after the nodes it reads from (stable where the
    given order already is one): inserted nodes may read tensors made further down."""
    made = {o: k for k, n in enumerate(nodes) for o in n.output}
    needs = [sorted({made[i] for i in _node_inputs(n) if i in made}) for n in nodes]
    done: set[int] = set()
    order: list[Any] = []
    for k in range(len(nodes)):
        stack = [(k, iter(needs[k]))]
        while stack:
            at, todo = stack[-1]
            nxt = next((d for d in todo if d not in done), None)
            if nxt is None:
                stack.pop()
                if at not in done:
                    done.add(at)
                    order.append(nodes[at])
            else:
                stack.append((nxt, iter(needs[nxt])))
    return order


def _scalars(model: Any, names: set[str]) -> dict[str, float]:
    """The tensors of ``names`` that are one value, the same at two input shapes (run with
    ONNX Runtime, basic optimisation): the constant scalars among them, by name."""
    import tempfile

    import numpy as np
    import onnx

    from engine.runtime.session import OrtModel, SessionSettings

    if not names:
        return {}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    present = {o for n in probe.graph.node for o in n.output}
    wanted = sorted(names & present)
    for name in wanted:
        probe.graph.output.append(onnx.helper.make_empty_tensor_value_info(name))
    values: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="memgate-trim-") as tmp:
        path = Path(tmp) / "probe.onnx"
        onnx.save(probe, str(path))
        del probe
        try:
            session = OrtModel(
                path, SessionSettings(graph_optimization="basic", allow_spinning=False)
            )
        except ModelError:
            return {}
        declared = session.session.get_inputs()
        for batch, length in ((1, 5), (2, 9)):
            feeds = {}
            for inp in declared:
                shape = [
                    d if isinstance(d, int) else (batch if k == 0 else length)
                    for k, d in enumerate(inp.shape)
                ]
                feeds[inp.name] = np.ones(shape, dtype=np.int64)
            try:
                out = session.run(feeds, quiet=True)
            except ModelError:
                return {}
            first = len(session.output_names) - len(wanted)
            values.append(dict(zip(wanted, out[first:], strict=True)))
    found = {}
    for name in wanted:
        a, b = (np.asarray(v[name]) for v in values)
        if a.size == 1 and b.size == 1 and a.dtype.kind == "f" and float(a) == float(b):
            found[name] = float(a.reshape(()))
    return found


class _Signature:
    """A tensor's structural signature: equal signatures mean equal values (the same ops with
    the same attributes over the same constants and inputs). The exporter recomputes the
    relative positions in every layer; their signatures tell that the index is one."""

    DEPTH = 24
    """Deeper than this a tensor stands for itself (its name)."""

    def __init__(self, edit: _Edit) -> None:
        self.edit = edit
        self.memo: dict[str, Any] = {}

    def __call__(self, name: str, depth: int = 0) -> Any:
        if name in self.memo:
            return self.memo[name]
        value = self.edit.constant(name)
        node = self.edit.producer.get(name)
        if value is not None:
            sig: Any = ("const", str(value.dtype), value.shape, value.tobytes())
        elif node is None or depth >= self.DEPTH or any(a.HasField("g") for a in node.attribute):
            sig = ("tensor", name)
        else:
            attrs = tuple(sorted((a.name, str(a).encode()) for a in node.attribute))
            sig = (
                node.op_type,
                node.domain,
                attrs,
                list(node.output).index(name),
                tuple(self(i, depth + 1) if i else "" for i in node.input),
            )
        self.memo[name] = sig
        return sig


def _relative(edit: _Edit, scalars: dict[str, float]) -> dict[str, int]:
    from onnx import helper

    counts = {"relative": 0, "relative_transposes_folded": 0, "relative_scales_moved": 0}
    left = 0
    const = edit.const
    indices: dict[tuple[Any, str | None, bool], str] = {}
    signature = _Signature(edit)
    shape_source: str | None = None
    for ge in edit.g.node:
        if ge.op_type != "GatherElements" or ge.name.startswith(PREFIX):  # already trimmed
            continue
        axis = next((a.i for a in ge.attribute if a.name == "axis"), 0)
        mm = edit.made_by(ge.input[0], "MatMul")
        tr = edit.made_by(mm.input[1], "Transpose") if mm is not None else None
        tile = (
            edit.made_by(tr.input[0], "Tile") if tr is not None and _perm(tr) == [0, 2, 1] else None
        )
        ex = edit.made_by(tile.input[0], "Expand") if tile is not None else None
        index = edit.producer.get(ge.input[1])
        start = None
        if index is not None and index.op_type == "Sub" and edit.made_by(index.input[0], "Expand"):
            start, index = index.input[1], edit.producer[index.input[0]]
        tile_users = edit.consumers.get(tile.output[0], []) if tile is not None else []
        if (
            axis not in (-1, 2)
            or mm is None
            or tr is None
            or tile is None
            or ex is None
            or index is None
            or index.op_type != "Expand"
            or len(edit.consumers.get(mm.output[0], [])) != 1
            or len(edit.consumers.get(tr.output[0], [])) != 1
            # besides the Transpose, only Shape: the exporter reads the head size off it
            or any(c is not tr and (c.op_type != "Shape" or c.attribute) for c in tile_users)
        ):
            left += 1
            continue
        p = f"{PREFIX}rel{counts['relative']}/"
        x, rows, pos = mm.input[0], ex.input[0], index.input[0]
        last: Any = ge
        flip = edit.only(ge.output[0], "Transpose")
        transposed = flip is not None and _perm(flip) == [0, 2, 1]
        if transposed:
            last = flip
            counts["relative_transposes_folded"] += 1
        div = edit.only(last.output[0], "Div")
        if div is not None and div.input[0] == last.output[0] and div.input[1] in scalars:
            last = div
            counts["relative_scales_moved"] += 1
        else:
            div = None
        i0, i1, i2, i3 = (const(f"i{k}", [k]) for k in range(4))
        nodes = [
            helper.make_node("Shape", [x], [p + "x_shape"]),
            helper.make_node("Shape", [rows], [p + "rows_shape"]),
            helper.make_node("Slice", [p + "rows_shape", i0, i1], [p + "heads"]),
            helper.make_node("Slice", [p + "rows_shape", i1, i2], [p + "width"]),
            helper.make_node("Slice", [p + "x_shape", i1, i2], [p + "len"]),
            helper.make_node("Slice", [p + "x_shape", i1, i3], [p + "ld"]),
            helper.make_node(
                "Concat", [const("minus1", [-1]), p + "heads", p + "ld"], [p + "shape4"], axis=0
            ),
            helper.make_node("Reshape", [x, p + "shape4"], [p + "x4"]),
        ]
        for c in tile_users:
            if c is not tr:  # the tiled rows' shape, [B*H, 2W, d], without tiling them
                nodes += [
                    helper.make_node("Slice", [p + "x_shape", i0, i1], [p + "bh"]),
                    helper.make_node("Slice", [p + "rows_shape", i1, i3], [p + "wd"]),
                    helper.make_node("Concat", [p + "bh", p + "wd"], [c.output[0]], axis=0),
                ]
                edit.dead.add(id(c))
                break
        if div is not None:
            nodes.append(helper.make_node("Div", [rows, div.input[1]], [p + "rows_s"]))
            rows = p + "rows_s"
        # p2c: N = rows . K^T, [B, H, 2W, L]; out[q, k] = N[pos[k, q], k] (gather along rows)
        # c2p: Q . rows^T, [B, H, L, 2W]; out[i, j] = that[i, pos[i, j]]
        product = [rows, p + "x4"] if transposed else [p + "x4", rows]
        dims = [p + "width", p + "len"] if transposed else [p + "len", p + "width"]
        nodes += [
            helper.make_node(
                "FusedMatMul",
                product,
                [p + "scores"],
                domain="com.microsoft",
                transA=0,
                transB=1,
                alpha=1.0,
            ),
            helper.make_node("Concat", [const("minus1", [-1]), *dims], [p + "shape3"], axis=0),
        ]
        nodes.append(helper.make_node("Reshape", [p + "scores", p + "shape3"], [p + "data"]))
        # One [B*H, L, L] index per distinct position tensor, shared by every layer that reads it
        key = (signature(pos), start, transposed)
        if key not in indices:
            q = f"{PREFIX}index{len(indices)}/"
            if shape_source is None:
                shape_source = q + "shape"
                nodes += [
                    helper.make_node("Slice", [p + "x_shape", i0, i1], [q + "bh"]),
                    helper.make_node(
                        "Concat", [q + "bh", p + "len", p + "len"], [shape_source], axis=0
                    ),
                ]
            nodes += [
                helper.make_node("Concat", [p + "len", p + "len"], [q + "len2"], axis=0),
                helper.make_node("Reshape", [pos, q + "len2"], [q + "pos"]),
            ]
            at = q + "pos"
            if start is not None:
                nodes.append(helper.make_node("Sub", [at, start], [q + "shifted"]))
                at = q + "shifted"
            if transposed:
                nodes.append(helper.make_node("Transpose", [at], [q + "t"], perm=[1, 0]))
                at = q + "t"
            nodes.append(helper.make_node("Expand", [at, shape_source], [q + "index"]))
            indices[key] = q + "index"
        nodes.append(
            helper.make_node(
                "GatherElements",
                [p + "data", indices[key]],
                [p + "out"],
                axis=1 if transposed else 2,
                name=p + "gather",
            )
        )
        edit.insert(ge, nodes)
        edit.renamed[last.output[0]] = p + "out"
        edit.dead.update({id(ge), id(last)})
        counts["relative"] += 1
    counts["relative_left"] = left
    return counts


def _scale(edit: _Edit, scalars: dict[str, float]) -> dict[str, int]:
    """``MatMul(Q, Div(Transpose(K, [0, 2, 1]), s))`` -> ``FusedMatMul(Q, K, transB, 1/s)``."""
    from onnx import helper

    done = 0
    for mm in edit.g.node:
        if mm.op_type != "MatMul":
            continue
        div = edit.made_by(mm.input[1], "Div")
        tr = edit.made_by(div.input[0], "Transpose") if div is not None else None
        if (
            div is None
            or tr is None
            or _perm(tr) != [0, 2, 1]
            or div.input[1] not in scalars
            or scalars[div.input[1]] == 0.0
            or len(edit.consumers.get(div.output[0], [])) != 1
        ):
            continue
        fused = helper.make_node(
            "FusedMatMul",
            [mm.input[0], tr.input[0]],
            [mm.output[0]],
            name=f"{PREFIX}scale{done}",
            domain="com.microsoft",
            transA=0,
            transB=1,
            alpha=1.0 / scalars[div.input[1]],
        )
        edit.insert(mm, [fused])
        edit.dead.add(id(mm))
        done += 1
    return {"scale": done}


def _absmax(edit: _Edit, opset: int) -> dict[str, int]:
    """``ReduceMax(Abs(x))`` over one axis -> ``Max(ReduceMax(x), Neg(ReduceMin(x)))``."""
    from onnx import helper

    done = 0
    for red in edit.g.node:
        if red.op_type != "ReduceMax":
            continue
        ab = edit.made_by(red.input[0], "Abs")
        if ab is None or len(edit.consumers.get(ab.output[0], [])) != 1:
            continue
        extra = list(red.input[1:])
        if opset < 18 and extra:  # ReduceMin takes axes as an input from opset 18 only
            continue
        p = f"{PREFIX}absmax{done}/"
        attrs = {a.name: helper.get_attribute_value(a) for a in red.attribute}
        nodes = [
            helper.make_node("ReduceMax", [ab.input[0], *extra], [p + "max"], **attrs),
            helper.make_node("ReduceMin", [ab.input[0], *extra], [p + "min"], **attrs),
            helper.make_node("Neg", [p + "min"], [p + "neg"]),
            helper.make_node("Max", [p + "max", p + "neg"], [red.output[0]]),
        ]
        edit.insert(red, nodes)
        edit.dead.update({id(red), id(ab)})
        done += 1
    return {"absmax": done}


def trim_graph(model_in: Path, model_out: Path, *, scales: bool = False) -> dict[str, Any]:
    """Write ``model_in`` to ``model_out`` with the rewrites of the module's docstring applied
    (the third only with ``scales``); returns what each changed (``relative_left`` counts the
    ``GatherElements`` nodes that did not match)."""
    model = read(model_in)
    g = model.graph
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    scalars: dict[str, float] = {}
    if scales:  # probe only the divisors a rewrite would use
        producer, _, _ = wiring(g)
        divisors = {
            n.input[1]
            for n in g.node
            if n.op_type == "Div"
            and len(n.input) == 2
            and getattr(producer.get(n.input[0]), "op_type", None)
            in ("GatherElements", "Transpose")
        }
        scalars = _scalars(model, divisors)
    steps: list[Callable[[_Edit], dict[str, int]]] = [
        lambda e: _relative(e, scalars),
        lambda e: _scale(e, scalars),
        lambda e: _absmax(e, opset),
    ]
    counts: dict[str, int] = {}
    for step in steps:
        edit = _Edit(g)
        counts.update(step(edit))
        edit.apply()
    if any(n.domain == "com.microsoft" for n in g.node) and not any(
        o.domain == "com.microsoft" for o in model.opset_import
    ):
        from onnx import helper

        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    from engine.pipeline.span import _save

    _save(model, model_out)
    return {"method": TRIM_METHOD, "scales": scales, "constant_scalars": len(scalars), **counts}
