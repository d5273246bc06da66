"""The static int8 variant (``int8-static``): activation scales calibrated on quality-set pairs.

Public entry point::

    build_static(out_dir, calibration_file, ...)   static int8 of a model into out_dir/int8-static/

Not the default int8 of any model: it moves aegis scores up to 0.60 against fp32 (see
:mod:`engine.pipeline.build`); it is built for comparison, with the decision flips it causes
recorded in its manifest.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.errors import InvalidInput
from engine.pipeline import checks, graph
from engine.pipeline._common import (
    _INT8_OPS,
    Log,
    _fmt_figures,
    _fmt_invariance,
    _fresh,
    _inherited_fields,
    _now,
    _pair_invariance,
    _Progress,
    _publish,
    _size,
    _versions,
    require_export,
)
from engine.runtime.manifest import load_manifest
from engine.runtime.session import OrtModel, SessionSettings

__all__ = ["STATIC_THRESHOLDS", "STATIC_VARIANT", "build_static", "decision_flips"]

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
