"""ONNX-level rewrites of an exported graph: optimise, quantise to int8, convert to fp16.

Each function reads one ``.onnx`` file, writes another and returns the settings it used, which
the builder stores in the artefact's manifest (the same idea as optimum's ``ort_config.json``).
``onnx`` and ``onnxruntime.quantization`` are imported inside the functions: ``onnx`` belongs to
the ``export`` extra.
"""

from __future__ import annotations

import logging
import platform
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.errors import ModelError

__all__ = [
    "BLOCKWISE_BLOCK",
    "OPTIMIZABLE_TYPES",
    "INT8_ROUTES",
    "blockwise_int8",
    "rowwise_int8",
    "static_int8",
    "read",
    "weight_matmuls",
    "wiring",
    "dequantize",
    "quiet",
    "detect_isa",
    "op_counts",
    "opset_of",
    "optimize",
    "quantization_settings",
    "quantize",
    "to_fp16",
]

# Model types whose graphs onnxruntime.transformers fuses with its "bert" optimiser.
OPTIMIZABLE_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "distilbert", "electra"})

_NOISY_LOGGERS = ("optimum", "transformers", "onnxruntime", "torch.onnx")


@contextmanager
def quiet() -> Iterator[None]:
    """Silence the exporters' chatter (tracer warnings, advice logged at WARNING) for one step.

    The builder prints one line per step; these messages are about the tools, not the model.
    Anything at ERROR still gets through.
    """
    root = logging.getLogger()
    loggers = [logging.getLogger(name) for name in _NOISY_LOGGERS] + [root]
    saved = [lg.level for lg in loggers]
    # logging.warning() on a handler-less root installs a stderr handler for good; a NullHandler
    # for the duration keeps onnxruntime.quantization from doing that.
    guard = logging.NullHandler() if not root.handlers else None
    if guard is not None:
        root.addHandler(guard)
    with warnings.catch_warnings():
        try:
            from torch.jit import TracerWarning

            warnings.simplefilter("ignore", TracerWarning)
        except ImportError:  # pragma: no cover - torch is absent only on int8/fp16-only paths
            pass
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, saved, strict=True):
                lg.setLevel(level)
            if guard is not None:
                root.removeHandler(guard)


def detect_isa(cpuinfo: str | None = None, machine: str | None = None) -> str:
    """The int8 instruction set this CPU offers: avx512_vnni, avx2, arm64 or generic."""
    machine = (machine or platform.machine()).lower()
    if machine in ("arm64", "aarch64"):
        return "arm64"
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
            break
    if "avx512_vnni" in flags or "avx_vnni" in flags:
        return "avx512_vnni"
    if "avx2" in flags:
        return "avx2"
    return "generic"


def quantization_settings(isa: str) -> dict[str, Any]:
    """Dynamic-quantisation settings per ISA (optimum's presets, weights always per channel).

    - avx512_vnni: signed 8-bit weights, full range (VPDPBUSD does not saturate).
    - avx2 and anything unknown: signed weights with ``reduce_range`` (7-bit), because VPMADDUBSW
      saturates its 16-bit sums on u8 x s8 products at full range.
    - arm64: signed weights, full range (u8 x s8 is as fast as u8 x u8 there).
    """
    reduce_range = isa not in ("avx512_vnni", "arm64")
    return {
        "isa": isa,
        "method": "dynamic",
        "tool": "onnxruntime.quantization.quantize_dynamic",
        "per_channel": True,
        "reduce_range": reduce_range,
        "weight_type": "QInt8",
        "activation_type": "QUInt8",
        "extra_options": {"DefaultTensorType": "FLOAT"},
    }


def quantize(
    model_in: Path,
    model_out: Path,
    *,
    isa: str | None = None,
    op_types: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Dynamic int8 quantisation of ``model_in`` to ``model_out``; returns the settings used.

    ``op_types`` limits which ops are quantised (None: onnxruntime's default set, which includes
    embedding lookups). ``DefaultTensorType`` FLOAT lets quantize_dynamic type tensors that shape
    inference left untyped (optimiser outputs otherwise fail with "Unable to find data type for
    weight_name").
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    settings = quantization_settings(isa or detect_isa())
    settings["op_types"] = list(op_types) if op_types else "onnxruntime default (IntegerOps)"
    with quiet():
        try:
            quantize_dynamic(
                str(model_in),
                str(model_out),
                op_types_to_quantize=list(op_types) if op_types else None,
                per_channel=settings["per_channel"],
                reduce_range=settings["reduce_range"],
                weight_type=QuantType.QInt8,
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
        except Exception as exc:  # onnxruntime.quantization raises untyped errors
            raise ModelError(f"int8 quantisation of {model_in.name} failed: {exc}") from exc
    return settings


def optimize(model_in: Path, model_out: Path, *, model_type: str = "bert") -> dict[str, Any]:
    """Offline transformer fusions (optimum's O2: extended graph optimisation, exact GELU)."""
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    with quiet():
        try:
            model = optimize_model(
                str(model_in),
                model_type="bert",
                num_heads=0,
                hidden_size=0,
                optimization_options=options,
                opt_level=2,
                use_gpu=False,
            )
            fused = {k: v for k, v in model.get_fused_operator_statistics().items() if v}
            model.save_model_to_file(str(model_out))
        except Exception as exc:  # onnxruntime.transformers raises untyped errors
            raise ModelError(f"optimising {model_in.name} failed: {exc}") from exc
    return {
        "tool": "onnxruntime.transformers.optimizer.optimize_model",
        "level": "O2",
        "model_type": "bert",
        "source_model_type": model_type,
        "opt_level": 2,
        "gelu_approximation": False,
        "use_gpu": False,
        "fused_operators": fused,
    }


def to_fp16(model_in: Path, model_out: Path) -> dict[str, Any]:
    """Convert weights and compute to float16, keeping fp32 inputs and outputs (for GPUs)."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    with quiet():
        try:
            model = convert_float_to_float16(onnx.load(str(model_in)), keep_io_types=True)
            onnx.save(model, str(model_out))
        except Exception as exc:  # onnx / onnxruntime.transformers raise untyped errors
            raise ModelError(f"fp16 conversion of {model_in.name} failed: {exc}") from exc
    return {
        "tool": "onnxruntime.transformers.float16.convert_float_to_float16",
        "keep_io_types": True,
        "intended_device": "cuda",
    }


def op_counts(path: Path) -> dict[str, int]:
    """How many nodes of each op type the graph holds (for structure checks and the manifest)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return dict(Counter(node.op_type for node in model.graph.node))


def opset_of(path: Path) -> int | None:
    """The default-domain opset the graph was written for."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return None


# --------------------------------------------------------------------------- row-invariant int8

BLOCKWISE_BLOCK = 32
"""K-block of the blockwise int8 graphs: weights carry one scale per (column, block) and, at
accuracy level 4, ONNX Runtime quantises each row's activations per block of this size."""


def _weight_blocks(q: Any, block: int) -> Any:
    """``[K, N]`` uint8 codes as MatMulNBits wants them: ``[N, K / block, block]``."""
    import numpy as np

    k, n = q.shape
    return np.ascontiguousarray(q.T.reshape(n, k // block, block))


def _int8_blocks(w: Any, block: int) -> tuple[Any, Any]:
    """Symmetric 8-bit codes (uint8 ``[K, N]``, zero point 128) and scales (``[N, K / block]``)
    of an fp32 ``[K, N]`` weight, one scale per (column, K-block)."""
    import numpy as np

    k, n = w.shape
    blocks = w.T.reshape(n, k // block, block).astype(np.float32)
    amax = np.abs(blocks).max(axis=2)
    scales = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    codes = np.clip(np.rint(blocks / scales[:, :, None]), -127, 127).astype(np.int16) + 128
    return np.ascontiguousarray(codes.astype(np.uint8).reshape(n, k).T), scales


def prune(g: Any, nodes: list[Any], added: Sequence[Any] = ()) -> None:
    """Set ``g``'s nodes to those of ``nodes`` (in order) that feed a graph output, and its
    initializers to those of ``g`` and ``added`` that the kept nodes read."""
    live = {o.name for o in g.output}
    keep = []
    for n in reversed(nodes):
        if any(o in live for o in n.output):
            keep.append(n)
            live.update(_node_inputs(n))
    keep.reverse()
    del g.node[:]
    g.node.extend(keep)
    used = {i for n in keep for i in _node_inputs(n)}
    inits = [i for i in [*g.initializer, *added] if i.name in used]
    del g.initializer[:]
    g.initializer.extend(inits)


def _node_inputs(node: Any) -> set[str]:
    """A node's inputs, with the outer-scope names its subgraphs (``If`` branches) read."""
    names = {i for i in node.input if i}
    for attr in node.attribute:
        for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
            inner = {o for n in sub.node for o in n.output} | {i.name for i in sub.initializer}
            for n in sub.node:
                names |= _node_inputs(n) - inner
    return names


def blockwise_int8(
    model_in: Path,
    model_out: Path,
    *,
    block_size: int = BLOCKWISE_BLOCK,
    accuracy_level: int = 4,
    dynamic_length: bool = False,
) -> dict[str, Any]:
    """Rewrite every MatMul with a constant weight as ``MatMulNBits`` (8-bit weights, one scale
    per column and K-block; activations quantised per row and block at ``accuracy_level`` 4), so
    that no row's result depends on the other rows of its batch.

    Two kinds of input graph are handled:

    - fp32 ``MatMul(x, W)``: ``W`` is quantised symmetrically per (column, block);
    - a dynamically quantised ``DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul(scale)``
      chain (``quantize_dynamic``'s output, the shipped aegis graph): its int8 weights are kept
      *exactly* (code + 128, the tensor's scale in every block), only the per-tensor activation
      quantisation, which couples a batch's rows, is replaced.

    ``dynamic_length`` turns a fixed sequence axis of the inputs into a symbolic one (the caller
    checks the result against the padded graph). Returns the settings used."""
    counts = _rewrite(
        model_in,
        model_out,
        target="blockwise",
        block_size=block_size,
        accuracy_level=accuracy_level,
        dynamic_length=dynamic_length,
    )
    return {
        "method": "blockwise",
        "tool": "memgate.pipeline.graph.blockwise_int8 (com.microsoft.MatMulNBits)",
        "bits": 8,
        "block_size": block_size,
        "accuracy_level": accuracy_level,
        "activations": "int8 per row and K-block (no scale is shared between rows)",
        **counts,
        "dynamic_length": dynamic_length,
    }


def rowwise_int8(
    model_in: Path, model_out: Path, *, dynamic_length: bool = False
) -> dict[str, Any]:
    """Like :func:`blockwise_int8`, but each constant-weight MatMul becomes ONNX Runtime's
    u8 x s8 ``MatMulIntegerToFloat`` (the dynamic int8 kernel, VNNI/AMX where the CPU has them)
    on activations quantised symmetrically *per row* (max |x| / 127, zero point 128, one
    per-axis ``QuantizeLinear``): row-invariant like blockwise, on the faster kernel, with a
    coarser activation grid (one scale per row instead of per row and 32-wide K-block).
    Weights: int8 per column (a dynamic int8 graph's are kept exactly)."""
    counts = _rewrite(model_in, model_out, target="rowwise", dynamic_length=dynamic_length)
    return {
        "method": "rowwise",
        "tool": "memgate.pipeline.graph.rowwise_int8 (com.microsoft.MatMulIntegerToFloat, "
        "per-row activation scales)",
        "bits": 8,
        "activations": "uint8 per row, symmetric (zero point 128); no scale shared between rows",
        **counts,
        "dynamic_length": dynamic_length,
    }


INT8_ROUTES = {"blockwise": blockwise_int8, "rowwise": rowwise_int8}
"""The row-invariant int8 rewrites by method name."""


def weight_matmuls(path: Path) -> list[str]:
    """Names of the MatMul nodes whose second input is a constant fp32 ``[K, N]`` weight (the
    projections and FFN layers; the attention products of two activations are not listed)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    names = []
    for node in model.graph.node:
        if node.op_type != "MatMul" or node.input[1] not in inits:
            continue
        w = numpy_helper.to_array(inits[node.input[1]])
        if w.dtype == np.float32 and w.ndim == 2:
            if not node.name:
                raise ModelError(f"{path.name}: a weight MatMul has no name to quantise it by")
            names.append(node.name)
    return names


def static_int8(
    model_in: Path,
    model_out: Path,
    calibration: Sequence[dict[str, Any]],
    *,
    source: str,
    method: str = "MinMax",
) -> dict[str, Any]:
    """Static int8 (QDQ) of every constant-weight MatMul of an fp32 graph: weights int8 per
    column (symmetric), activations uint8 with one scale and zero point per tensor *calibrated
    once* on ``calibration`` (feeds of one item each) and then fixed, so no row's result depends
    on its batch-mates. Outputs stay fp32 (``OpTypesToExcludeOutputQuantization``), which lets
    ONNX Runtime fuse each ``DequantizeLinear -> MatMul`` into ``MatMulIntegerToFloat``, the
    same u8 x s8 kernel as dynamic int8. ``source`` (where the calibration items came from) is
    recorded in the returned settings."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    if not calibration:
        raise ModelError("static int8 needs at least one calibration item")
    import onnx

    nodes = weight_matmuls(model_in)
    wanted = {i.name for i in onnx.load(str(model_in), load_external_data=False).graph.input}
    if not nodes:
        raise ModelError(f"{model_in.name} has no MatMul with a constant weight to quantise")

    class _Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._items = iter([{k: v for k, v in f.items() if k in wanted} for f in calibration])

        def get_next(self) -> dict[str, Any] | None:
            return next(self._items, None)

    with quiet():
        try:
            quantize_static(
                str(model_in),
                str(model_out),
                _Reader(),
                quant_format=QuantFormat.QDQ,
                op_types_to_quantize=["MatMul"],
                nodes_to_quantize=nodes,
                per_channel=True,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=getattr(CalibrationMethod, method),
                extra_options={
                    "WeightSymmetric": True,
                    "ActivationSymmetric": False,
                    "MatMulConstBOnly": True,
                    "OpTypesToExcludeOutputQuantization": ["MatMul"],
                },
            )
        except Exception as exc:  # onnxruntime.quantization raises untyped errors
            raise ModelError(f"static int8 quantisation of {model_in.name} failed: {exc}") from exc
    return {
        "method": "static",
        "tool": "onnxruntime.quantization.quantize_static (QDQ -> MatMulIntegerToFloat)",
        "bits": 8,
        "per_channel": True,
        "weight_type": "QInt8 symmetric, per column",
        "activations": "QUInt8, one calibrated scale per tensor, fixed: none depends on a batch",
        "calibration": {"method": method, "items": len(calibration), "source": source},
        "weights_requantised": len(nodes),
    }


def dequantize(model_in: Path, model_out: Path, *, dynamic_length: bool = False) -> dict[str, Any]:
    """The fp32 reference of a dynamically quantised graph: each ``MatMulInteger`` chain becomes
    an fp32 ``MatMul`` on its dequantised weight (the same weights, activations unquantised).
    Used to measure a shipped int8 graph's drift when no fp32 export of it exists."""
    counts = _rewrite(model_in, model_out, target="fp32", dynamic_length=dynamic_length)
    return {"tool": "memgate.pipeline.graph.dequantize", **counts}


def read(path: Path) -> Any:
    """The ONNX model at ``path`` (weights included), or :class:`ModelError`."""
    import onnx

    try:
        return onnx.load(str(path))
    except Exception as exc:  # onnx raises untyped errors
        raise ModelError(f"cannot read {Path(path).name}: {exc}") from exc


def wiring(
    g: Any,
) -> tuple[dict[str, Any], dict[str, list[Any]], Callable[[str], Any | None]]:
    """A graph's wiring: each tensor's producing node, each tensor's consuming nodes, and a
    reader of constant tensors (initialisers and ``Constant`` nodes; None for the others)."""
    from onnx import numpy_helper

    inits = {i.name: i for i in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list[Any]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def constant(name: str) -> Any | None:
        if name in inits:
            return numpy_helper.to_array(inits[name])
        node = producer.get(name)
        if node is not None and node.op_type == "Constant" and node.attribute:
            return numpy_helper.to_array(node.attribute[0].t)
        return None

    return producer, consumers, constant


def _rewrite(
    model_in: Path,
    model_out: Path,
    *,
    target: str,
    block_size: int = BLOCKWISE_BLOCK,
    accuracy_level: int = 4,
    dynamic_length: bool = False,
) -> dict[str, int]:
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = read(model_in)
    g = model.graph
    producer, consumers, constant = wiring(g)
    replaced: dict[int, Any] = {}
    dropped: set[int] = set()
    added: list[Any] = []
    counts = {"weights_kept_exact": 0, "weights_requantised": 0, "matmuls_left": 0}

    def emit(node: Any, x: str, out: str, weight: Any) -> None:
        """``out = x @ weight`` in the target form; ``weight`` is fp32 ``[K, N]`` or a tuple of
        uint8 codes ``[K, N]`` and ``[N, K / block]`` scales."""
        base = (node.name or out).replace("/", "_").strip("_")
        if target == "fp32":
            added.append(numpy_helper.from_array(weight.astype(np.float32), f"{base}_w"))
            replaced[id(node)] = helper.make_node("MatMul", [x, f"{base}_w"], [out], name=base)
            return
        codes, scales = weight if isinstance(weight, tuple) else _int8_blocks(weight, block_size)
        k, n = codes.shape
        b_name, s_name = f"{base}_nb8_codes", f"{base}_nb8_scales"
        added.append(numpy_helper.from_array(_weight_blocks(codes, block_size), b_name))
        added.append(numpy_helper.from_array(scales.reshape(-1).astype(np.float32), s_name))
        replaced[id(node)] = helper.make_node(
            "MatMulNBits",
            [x, b_name, s_name],
            [out],
            name=f"{base}_nb8",
            domain="com.microsoft",
            K=k,
            N=n,
            bits=8,
            block_size=block_size,
            accuracy_level=accuracy_level,
        )

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 13)
    shared: dict[str, str] = {}

    def const(name: str, value: Any) -> str:
        if name not in shared:
            added.append(numpy_helper.from_array(np.asarray(value), name))
            shared[name] = name
        return name

    def emit_rowwise(node: Any, x: str, out: str, w: Any, scale: Any) -> None:
        """``out = x @ W`` with int8 ``W`` (``[K, N]``, per-column ``scale``) and ``x``
        quantised symmetrically *per row* (scale = the row's max |x| / 127, zero point 128), so
        no scale is shared between rows. The rows are quantised by one per-axis
        ``QuantizeLinear`` on ``x`` flattened to ``[rows, K]`` (opset 13; the blocked form needs
        opset 21) and reshaped back; the product is ONNX Runtime's fused u8 x s8
        ``MatMulIntegerToFloat`` (the dynamic int8 kernel, with the weight scales and the
        int32-to-float conversion in one pass), times the row scales."""
        base = (node.name or out).replace("/", "_").strip("_") + "_rq"
        t = f"{base}/"
        nodes = [helper.make_node("Abs", [x], [t + "abs"])]
        if opset >= 18:
            axes = const("rowwise_axes", np.array([-1], np.int64))
            nodes.append(helper.make_node("ReduceMax", [t + "abs", axes], [t + "amax"], keepdims=1))
        else:
            nodes.append(
                helper.make_node("ReduceMax", [t + "abs"], [t + "amax"], axes=[-1], keepdims=1)
            )
        nodes += [
            helper.make_node(
                "Max", [t + "amax", const("rowwise_eps", np.float32(1e-12))], [t + "amax1"]
            ),
            helper.make_node(
                "Mul", [t + "amax1", const("rowwise_inv127", np.float32(1 / 127))], [t + "xs"]
            ),
            # one scale and one zero point per row, as the 1-D tensors per-axis quantisation takes
            helper.make_node(
                "Reshape", [t + "xs", const("rowwise_flat", np.array([-1], np.int64))], [t + "s1"]
            ),
            helper.make_node("Shape", [t + "s1"], [t + "rows"]),
            helper.make_node(
                "ConstantOfShape",
                [t + "rows"],
                [t + "zp"],
                value=numpy_helper.from_array(np.array([128], np.uint8)),
            ),
            helper.make_node("Flatten", [x], [t + "x2"], axis=-1),
            helper.make_node("QuantizeLinear", [t + "x2", t + "s1", t + "zp"], [t + "q2"], axis=0),
            helper.make_node("Shape", [x], [t + "shape"]),
            helper.make_node("Reshape", [t + "q2", t + "shape"], [t + "q"]),
        ]
        w_name, ws = f"{base}_w", f"{base}_wscale"
        added.append(numpy_helper.from_array(w.astype(np.int8), w_name))
        added.append(numpy_helper.from_array(scale.astype(np.float32), ws))
        nodes += [
            helper.make_node(
                "MatMulIntegerToFloat",
                [
                    t + "q",
                    w_name,
                    const("rowwise_one", np.float32(1.0)),
                    ws,
                    const("rowwise_zp128", np.uint8(128)),
                ],
                [t + "y"],
                name=base,
                domain="com.microsoft",
            ),
            helper.make_node("Mul", [t + "y", t + "xs"], [out]),
        ]
        replaced[id(node)] = nodes

    for node in g.node:
        if node.op_type == "MatMulInteger":
            chain = _dynamic_chain(node, producer, consumers, constant)
            if chain is None or chain[2].shape[0] % block_size:
                counts["matmuls_left"] += 1
                continue
            x, out, w, zp, scale, extra = chain
            k, n = w.shape
            centred = w.astype(np.int16) - zp[None, :]
            if target == "fp32":
                emit(node, x, out, centred.astype(np.float32) * scale[None, :])
            elif centred.min() < -128 or centred.max() > 127:
                counts["matmuls_left"] += 1
                continue
            elif target == "rowwise":
                emit_rowwise(node, x, out, centred, scale)
            else:
                codes = (centred + 128).astype(np.uint8)
                scales = np.repeat(scale[:, None], k // block_size, axis=1)
                emit(node, x, out, (codes, scales.astype(np.float32)))
            dropped.update(id(e) for e in extra)
            counts["weights_kept_exact"] += 1
        elif node.op_type == "MatMul" and target in ("blockwise", "rowwise"):
            w = constant(node.input[1])
            if w is None or w.dtype != np.float32 or w.ndim != 2 or w.shape[0] % block_size:
                continue
            if target == "rowwise":
                amax = np.abs(w).max(axis=0)
                scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
                codes = np.clip(np.rint(w / scale[None, :]), -127, 127).astype(np.int8)
                emit_rowwise(node, node.input[0], node.output[0], codes, scale)
            else:
                emit(node, node.input[0], node.output[0], w)
            counts["weights_requantised"] += 1

    nodes: list[Any] = []
    for n in g.node:
        if id(n) not in dropped:
            new = replaced.get(id(n), n)
            nodes.extend(new if isinstance(new, list) else [new])
    # Drop what no longer feeds an output (the activation quantisers, the scale products).
    prune(g, nodes, added)
    if target in ("blockwise", "rowwise") and not any(
        o.domain == "com.microsoft" for o in model.opset_import
    ):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    if dynamic_length:
        for inp in g.input:
            dims = inp.type.tensor_type.shape.dim
            if len(dims) == 2 and dims[1].HasField("dim_value"):
                dims[1].ClearField("dim_value")
                dims[1].dim_param = "sequence"
        del g.value_info[:]  # shapes inferred for the fixed length would now be wrong
    try:
        onnx.save(model, str(model_out))
    except Exception as exc:  # onnx raises untyped errors
        raise ModelError(f"cannot write {model_out.name}: {exc}") from exc
    return counts


def _dynamic_chain(
    node: Any,
    producer: dict[str, Any],
    consumers: dict[str, list[Any]],
    constant: Any,
) -> tuple[str, str, Any, Any, Any, list[Any]] | None:
    """``DynamicQuantizeLinear(x) -> MatMulInteger(., W) -> Cast -> Mul(x_scale * w_scale)``
    as (x, the Mul's output, int8 W, W's zero points and scales per column, the nodes it
    replaces); None when ``node`` is not the head of such a chain with a constant weight."""
    import numpy as np

    x_q, w_q, _, w_zp = (list(node.input) + [""] * 4)[:4]
    dql = producer.get(x_q)
    after = consumers.get(node.output[0], [])
    cast = after[0] if len(after) == 1 and after[0].op_type == "Cast" else None
    muls = consumers.get(cast.output[0], []) if cast is not None else []
    mul = muls[0] if len(muls) == 1 and muls[0].op_type == "Mul" else None
    scales = producer.get(mul.input[1]) if mul is not None else None
    w = constant(w_q)
    if (
        dql is None
        or dql.op_type != "DynamicQuantizeLinear"
        or mul is None
        or scales is None
        or scales.op_type != "Mul"
        or w is None
        or w.dtype != np.int8
        or w.ndim != 2
    ):
        return None
    w_scale_name = next((i for i in scales.input if i != dql.output[1]), None)
    w_scale = constant(w_scale_name) if w_scale_name else None
    zp = constant(w_zp) if w_zp else np.zeros((), np.int8)
    n = w.shape[1]
    if w_scale is None or zp is None or w_scale.size not in (1, n) or zp.size not in (1, n):
        return None
    # per tensor or per column (quantize_dynamic's per_channel): one value per column either way
    scale = np.broadcast_to(w_scale.astype(np.float32).reshape(-1), (n,)).copy()
    zero = np.broadcast_to(zp.astype(np.int16).reshape(-1), (n,)).copy()
    return dql.input[0], mul.output[0], w, zero, scale, [cast, mul]
