"""The CPU a process runs on: its model name and the instruction sets that change what the
ONNX Runtime kernels compute (an int8 model's scores differ slightly between AVX2, AVX-512 VNNI
and AMX kernels). Benchmarks record it with every figure; a fitted judge records where it was
fitted, and the gate warns when it is served on a CPU of other instruction sets."""

from __future__ import annotations

import platform
from functools import lru_cache
from pathlib import Path

__all__ = ["ISA", "cpu"]

ISA = (
    "sse4_2 avx avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx_vnni avx512_bf16 "
    "avx512_fp16 amx_tile amx_int8 amx_bf16 neon asimddp sve"
).split()
"""The flags reported, in this order (those of :data:`ISA` the CPU has)."""


@lru_cache(maxsize=1)
def cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, tuple[str, ...]]:
    """``(model name, flags of ISA present)``; the platform's processor name and no flags where
    ``cpuinfo`` cannot be read (not Linux)."""
    model, flags = platform.processor() or platform.machine(), set[str]()
    try:
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model in ("", platform.machine(), platform.processor()):
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return model, tuple(f for f in ISA if f in flags)
