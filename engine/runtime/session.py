"""The one place ONNX Runtime sessions are created and run.

CPU or CUDA provider, thread pools, graph optimisation level, and IO binding on CUDA are all
decided here from :class:`SessionSettings`, so every model runs under the same rules. On 2 cores a
second busy thread pool halves GEMM throughput, so the default is one intra-op pool sized to the
physical cores and a sequential inter-op executor.

ONNX Runtime 1.29+ ships opt-out telemetry on Linux and macOS: when it is imported it creates a
persistent device id and an offline event cache under ``~/.cache/Microsoft`` and starts an
uploader. memgate holds private memories and promises to open nothing outside its cache, data
directory and installation, so this module opts out (``ORT_DISABLE_TELEMETRY=1``, which must be
set before the import) unless the operator set the variable themselves.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")
import onnxruntime as ort  # noqa: E402  (after the opt-out, which is read at import)

from engine.errors import InvalidInput, ModelError

__all__ = ["OrtModel", "SessionSettings", "available_devices", "cuda_available"]

if os.environ.get("ORT_DISABLE_TELEMETRY") == "1":
    ort.disable_telemetry_events()  # the Windows (ETW) side of the same opt-out

_LEVELS = {
    "disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


@dataclass(frozen=True)
class SessionSettings:
    """How a model session runs. Every field has a safe default."""

    device: Literal["cpu", "cuda"] = "cpu"
    """Execution provider. ``cuda`` needs the ``gpu`` extra (onnxruntime-gpu) and a CUDA device."""
    intra_op_threads: int = 0
    """Threads of the one GEMM pool; 0 = the number of usable CPU cores."""
    inter_op_threads: int = 1
    """Parallel executor threads; 1 keeps one busy pool (a second one halves throughput)."""
    graph_optimization: Literal["disable", "basic", "extended", "all"] = "all"
    """ONNX Runtime's online graph optimisation level."""
    io_binding: bool = True
    """On CUDA, bind inputs and outputs to device buffers (no effect on CPU)."""
    cuda_device_id: int = 0
    allow_spinning: bool = True
    """Let pool threads spin between ops: faster back-to-back batches, busier idle cores."""

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise InvalidInput(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if not 0 <= self.intra_op_threads <= 256:
            raise InvalidInput(f"intra_op_threads must be in [0, 256], got {self.intra_op_threads}")
        if not 1 <= self.inter_op_threads <= 64:
            raise InvalidInput(f"inter_op_threads must be in [1, 64], got {self.inter_op_threads}")
        if self.graph_optimization not in _LEVELS:
            raise InvalidInput(f"graph_optimization must be one of {sorted(_LEVELS)}")
        if self.cuda_device_id < 0:
            raise InvalidInput("cuda_device_id must be >= 0")


def cuda_available() -> bool:
    return "CUDAExecutionProvider" in ort.get_available_providers()


def available_devices() -> list[str]:
    return ["cpu", "cuda"] if cuda_available() else ["cpu"]


def _threads(requested: int) -> int:
    if requested:
        return requested
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


class OrtModel:
    """An ONNX Runtime session plus the way to feed it (plain run or CUDA IO binding)."""

    def __init__(self, path: Path, settings: SessionSettings) -> None:
        self.settings = settings
        opts = ort.SessionOptions()
        opts.graph_optimization_level = _LEVELS[settings.graph_optimization]
        opts.intra_op_num_threads = _threads(settings.intra_op_threads)
        opts.inter_op_num_threads = settings.inter_op_threads
        opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        opts.log_severity_level = 3
        if not settings.allow_spinning:
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if settings.device == "cuda":
            if not cuda_available():
                raise ModelError(
                    "device 'cuda' asked for, but onnxruntime has no CUDA provider here: "
                    "install the gpu extra (pip install 'memgate[gpu]') on a machine with CUDA"
                )
            providers: list[str | tuple[str, dict[str, object]]] = [
                ("CUDAExecutionProvider", {"device_id": settings.cuda_device_id}),
                "CPUExecutionProvider",
            ]
        else:
            providers = ["CPUExecutionProvider"]
        try:
            self.session = ort.InferenceSession(str(path), sess_options=opts, providers=providers)
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise ModelError(f"cannot load ONNX model {path}: {exc}") from exc
        self.input_names = tuple(i.name for i in self.session.get_inputs())
        self.output_names = tuple(o.name for o in self.session.get_outputs())
        self.input_types = {i.name: i.type for i in self.session.get_inputs()}
        self.input_shapes = {i.name: tuple(i.shape) for i in self.session.get_inputs()}
        """Declared shapes: ints for fixed axes, names or None for dynamic ones."""
        self._bind = settings.device == "cuda" and settings.io_binding

    @property
    def providers(self) -> list[str]:
        return list(self.session.get_providers())

    def run(self, feeds: Mapping[str, np.ndarray], *, quiet: bool = False) -> list[np.ndarray]:
        """Run the graph on ``feeds`` (only the inputs the graph declares are passed).

        ONNX Runtime's own failures become :class:`ModelError`; ``quiet`` keeps ONNX Runtime
        from printing them as well (for probes that expect to fail)."""
        try:
            return self._run({k: v for k, v in feeds.items() if k in self.input_types}, quiet)
        except ModelError:
            raise
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise ModelError(f"the model failed to run: {str(exc)[:300]}") from exc

    def _run(self, feeds: Mapping[str, np.ndarray], quiet: bool) -> list[np.ndarray]:
        options = None
        if quiet:
            options = ort.RunOptions()
            options.log_severity_level = 4
        if not self._bind:
            return list(self.session.run(None, dict(feeds), options))
        binding = self.session.io_binding()
        dev = self.settings.cuda_device_id
        for name, array in feeds.items():
            value = ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array), "cuda", dev)
            binding.bind_ortvalue_input(name, value)
        for name in self.output_names:
            binding.bind_output(name, "cuda", dev)
        self.session.run_with_iobinding(binding, options)
        return [np.asarray(v) for v in binding.copy_outputs_to_cpu()]
