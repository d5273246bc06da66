"""What the builders share: progress lines, freshness, publishing, tokenizer preparation.

:mod:`engine.pipeline.build` (export from PyTorch), :mod:`engine.pipeline.aegis` (the shipped
int8 classifier) and :mod:`engine.pipeline.static` (static int8) all import from here, and this
module imports none of them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import platform
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

import engine
from engine.errors import ModelError
from engine.pipeline import checks
from engine.pipeline.checks import Tolerance
from engine.runtime.layout import staging
from engine.runtime.manifest import Manifest, load_manifest, write_manifest
from engine.runtime.session import OrtModel

__all__ = ["PIPELINE_VERSION", "Log", "require_export"]

Log = Callable[[str], None]

PIPELINE_VERSION = 3
"""Bumped when a change here makes earlier artefacts stale (they are rebuilt, not trusted).
3: DeBERTa NLI graphs are trimmed (:mod:`engine.pipeline.trim`), recorded as ``trim``."""

_EXPORT_EXTRA = "pip install 'memgate[export]'"


def require_export() -> None:
    """Fail with a message naming the ``export`` extra without torch/optimum/transformers."""
    for module in ("torch", "transformers", "optimum.exporters.onnx", "onnx"):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ModelError(
                f"building models needs the export extra ({module} is missing): {_EXPORT_EXTRA}"
            ) from exc


# --------------------------------------------------------------------------- progress lines


class _Progress:
    """One line per step, with its wall time; failures say which step failed."""

    def __init__(self, log: Log, prefix: str) -> None:
        self.log = log
        self.prefix = prefix

    def info(self, message: str, variant: str | None = None) -> None:
        tag = f"{self.prefix}/{variant}" if variant else self.prefix
        self.log(f"[{tag}] {message}")

    @contextmanager
    def step(self, what: str, variant: str | None = None) -> Iterator[list[str]]:
        notes: list[str] = []
        start = time.perf_counter()
        try:
            yield notes
        except BaseException:
            self.info(f"{what}: FAILED after {time.perf_counter() - start:.1f} s", variant)
            raise
        detail = f": {', '.join(notes)}" if notes else ""
        self.info(f"{what}{detail} ({time.perf_counter() - start:.1f} s)", variant)


# --------------------------------------------------------------------------- helpers


_TOOLS = ("onnxruntime", "onnx", "optimum", "optimum-onnx", "transformers", "torch", "tokenizers")


def _versions() -> dict[str, str]:
    out = {"memgate": engine.__version__, "python": platform.python_version()}
    for dist in _TOOLS:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _size(path: Path) -> str:
    total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return f"{total / 2**20:.1f} MiB"


def _fresh(
    directory: Path, revision: str, *, isa: str | None = None, method: str | None = None
) -> Manifest | None:
    """The artefact's manifest when it verifies and was built from ``revision`` by this pipeline.

    An int8 artefact quantised for another ISA (a cache copied between machines), or by another
    quantisation ``method`` than the one now chosen, is stale too.
    """
    try:
        manifest = load_manifest(directory)
    except ModelError:
        return None
    if manifest.source.get("revision") != revision:
        return None
    if manifest.extra.get("pipeline_version") != PIPELINE_VERSION:
        return None
    quantization = manifest.extra.get("quantization")
    if isa and manifest.variant == "int8" and isinstance(quantization, dict):
        if quantization.get("isa") != isa:
            return None
    if method and manifest.variant == "int8" and isinstance(quantization, dict):
        if quantization.get("method") != method:
            return None
    return manifest


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _publish(final: Path, files: Mapping[str, Path], fields: dict[str, Any]) -> Path:
    """Write ``files`` (name -> path) and the manifest into ``final`` atomically."""
    with staging(final) as tmp:
        for name, path in files.items():
            _link_or_copy(path, tmp / name)
        write_manifest(tmp, fields, sorted(files))
    return final


def _fmt_figures(figures: Mapping[str, Any], tol: Tolerance | None) -> str:
    text = f"max|Δ| {figures['max_abs_diff']:.2e}"
    if tol is not None:
        text += f" (atol {tol.atol:g})"
    if "min_cosine" in figures:
        text += f", cos min {figures['min_cosine']:.6f} mean {figures['mean_cosine']:.6f}"
    if "argmax_agreement" in figures:
        text += f", argmax agree {figures['argmax_agreement']:.0%}"
    return text


@dataclass(frozen=True)
class _TokenizerInfo:
    path: Path
    pad_id: int
    pad_token: str
    model_max_length: int | None


def _pad_token_of(tokenizer_dir: Path) -> str | None:
    config = tokenizer_dir / "tokenizer_config.json"
    if config.is_file():
        pad = json.loads(config.read_text(encoding="utf-8")).get("pad_token")
        if isinstance(pad, dict):
            pad = pad.get("content")
        if isinstance(pad, str):
            return pad
    return None


def _prepare_tokenizer(tokenizer_dir: Path, work: Path) -> _TokenizerInfo:
    """``tokenizer.json`` with padding and truncation cleared (the runtime sets them itself)."""
    from tokenizers import Tokenizer

    src = tokenizer_dir / "tokenizer.json"
    if not src.is_file():
        # Only a slow tokenizer (spm.model / vocab.txt): let transformers convert it once.
        try:
            from transformers import AutoTokenizer

            converted = work / "converted-tokenizer"
            AutoTokenizer.from_pretrained(
                str(tokenizer_dir), use_fast=True, local_files_only=True
            ).save_pretrained(str(converted))
            src = converted / "tokenizer.json"
            if not src.is_file():
                raise FileNotFoundError(src)
        except Exception as exc:  # transformers raises many kinds here
            raise ModelError(
                f"{tokenizer_dir} has no tokenizer.json and converting its tokenizer failed "
                f"({type(exc).__name__}: {exc}); install sentencepiece or ship a tokenizer.json"
            ) from exc
    tok = Tokenizer.from_file(str(src))
    baked = tok.padding
    candidates = [baked["pad_token"]] if baked else []
    candidates += [t for t in (_pad_token_of(tokenizer_dir), "[PAD]", "<pad>") if t]
    pad_token = next((t for t in candidates if tok.token_to_id(t) is not None), None)
    if pad_token is None:
        raise ModelError(f"cannot tell the padding token of {src}")
    tok.no_padding()
    tok.no_truncation()
    out = work / "tokenizer.json"
    tok.save(str(out))
    max_len = None
    config = tokenizer_dir / "tokenizer_config.json"
    if config.is_file():
        value = json.loads(config.read_text(encoding="utf-8")).get("model_max_length")
        if isinstance(value, int) and 0 < value < 1_000_000:
            max_len = value
    pad_id = tok.token_to_id(pad_token)
    assert pad_id is not None
    return _TokenizerInfo(out, int(pad_id), pad_token, max_len)


# --------------------------------------------------------------------------- derived variants


def _pair_invariance(
    tok: Path, model: OrtModel, max_length: int, pad: int, static_length: int | None = None
) -> dict[str, Any]:
    """Batch invariance of an NLI graph's raw logits on the check pairs."""
    return checks.batch_invariance(
        tok,
        checks.PAIRS,
        lambda f: model.run(f)[0].astype(np.float64),
        max_length=max_length,
        pad_id=pad,
        static_length=static_length,
    )


def _inherited_fields(directory: Path) -> dict[str, Any]:
    """The manifest fields a derived variant takes over from the artefact it is built from
    (everything but what belongs to one artefact: its files, format, seal, smoke and parity)."""
    manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
    own = ("files", "format", "manifest_sha256", "smoke", "parity")
    return {k: v for k, v in manifest.items() if k not in own}


def _fmt_invariance(figures: Mapping[str, Any]) -> str:
    verdict = "invariant" if figures["invariant"] else "NOT invariant (runs one item per pass)"
    return f"max|Δ| {figures['max_abs_diff']:.2e} (atol {figures['atol']:g}): {verdict}"


_INT8_OPS = frozenset(
    {
        "MatMulNBits",
        "MatMulInteger",
        "MatMulIntegerToFloat",
        "QuantizeLinear",
        "DynamicQuantizeLinear",
        "DynamicQuantizeMatMul",
        "QAttention",
        "QEmbedLayerNormalization",
        "QGemm",
        "DequantizeLinear",
    }
)


def _fmt_span(relative: Mapping[str, Any]) -> str:
    if not relative["narrowed"]:
        return "no relative-position attention: unchanged"
    return f"{relative['narrowed']} position products narrowed (span {relative['span']})"


TRIM_ATOL = 1e-5
"""Largest logit change the trim (:mod:`engine.pipeline.trim`) may cause on the check set. It
removes work without changing what is computed: measured bit-identical on every NLI graph the
pipeline builds (fp32 and rowwise int8, aegis included)."""
TRIM_BARS = (0.5, 0.8, 0.95)
"""Contradiction bars at which the trimmed graph must decide as the untrimmed one."""


def _trim(
    path: Path,
    out: Path,
    run: Callable[[Path], np.ndarray],
    *,
    contradiction: int | None,
) -> tuple[Path, dict[str, Any]]:
    """Trim ``path`` into ``out`` (:func:`engine.pipeline.trim.trim_graph`) and check it: both
    graphs run on the check set through ``run(path) -> logits``; the logits may differ by
    :data:`TRIM_ATOL` at most, the argmax never and (with a ``contradiction`` label index) no
    pair may cross a :data:`TRIM_BARS` bar. Returns the graph to publish and the record for
    the manifest: the trimmed graph when it passes, else the untrimmed one, with the figures
    and ``applied`` false (a graph with nothing to trim is kept as it is)."""
    from engine.pipeline.trim import trim_graph

    settings = trim_graph(path, out)
    changed = sum(settings[k] for k in ("relative", "scale", "absmax"))
    if not changed:
        return path, {**settings, "applied": False, "reason": "nothing matched"}
    before, after = run(path), run(out)
    figures = checks.compare(after, before, task="nli")
    record: dict[str, Any] = {
        **settings,
        "against": "the same graph untrimmed",
        "check_set": checks.CHECK_SET_ID,
        "atol": TRIM_ATOL,
        **figures,
    }
    if contradiction is not None:

        def probs(x: np.ndarray) -> np.ndarray:
            e = np.exp(x - x.max(axis=1, keepdims=True))
            return (e / e.sum(axis=1, keepdims=True))[:, contradiction]

        p, q = probs(after), probs(before)
        record["flips"] = {str(t): int(((p > t) != (q > t)).sum()) for t in TRIM_BARS}
    flips = sum(record.get("flips", {}).values())
    ok = (
        figures["max_abs_diff"] <= TRIM_ATOL
        and figures.get("argmax_agreement", 1.0) == 1.0
        and not flips
    )
    record["applied"] = ok
    if not ok:
        record["reason"] = "scores moved on the check set: the untrimmed graph is published"
    return (out if ok else path), record


def _fmt_trim(record: Mapping[str, Any]) -> str:
    if "max_abs_diff" not in record:
        return "nothing to trim"
    return (
        f"{record['relative']} relative-position chains, {record['scale']} scales, "
        f"{record['absmax']} abs-max; max|Δ| vs untrimmed {record['max_abs_diff']:.1e} "
        f"(atol {record['atol']:g}), flips {record.get('flips', {})}: "
        + ("applied" if record["applied"] else "NOT applied (" + record["reason"] + ")")
    )
