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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from engine.errors import ModelError

__all__ = [
    "OPTIMIZABLE_TYPES",
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
