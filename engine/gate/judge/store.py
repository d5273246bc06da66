"""The judge file: ``<cache_dir>/judges/<embedder>-<variant>+<nli>-<variant>.json``, sealed like
a model manifest (``judge_sha256`` of its canonical JSON), written atomically, naming the model
graphs it was fitted with: after a rebuild of either the gate decides by the rule alone.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from engine.errors import ModelError
from engine.fsutil import write_atomic
from engine.gate.judge import FORMAT, Judge
from engine.gate.judge.boost import Boost
from engine.gate.judge.features import FEATURES
from engine.runtime.cpu import cpu
from engine.runtime.layout import check_name
from engine.runtime.manifest import manifest_digest

__all__ = [
    "JUDGES_DIR",
    "OlderJudge",
    "SEAL",
    "find_judge",
    "fitted_elsewhere",
    "judge_path",
    "load_judge",
    "model_identity",
    "save_judge",
]

JUDGES_DIR = "judges"
SEAL = "judge_sha256"

log = logging.getLogger("memgate.judge")


def model_identity(model: Any) -> dict[str, Any]:
    """Name, variant and graph sha256 of a loaded runtime (its manifest's record of the
    model file); what a judge is bound to."""
    m = model.manifest
    return {
        "name": m.name,
        "variant": m.variant,
        "model_sha256": (m.files.get(m.model_file) or {}).get("sha256"),
    }


def judge_path(cache_dir: Path, embedder: dict[str, Any], nli: dict[str, Any]) -> Path:
    """Where the judge of these two models (:func:`model_identity`) lives."""
    parts = [
        check_name(str(m[k]), "model name") for m in (embedder, nli) for k in ("name", "variant")
    ]
    return Path(cache_dir) / JUDGES_DIR / f"{parts[0]}-{parts[1]}+{parts[2]}-{parts[3]}.json"


def save_judge(path: Path, judge: Judge) -> Path:
    body: dict[str, Any] = {
        "format": FORMAT,
        "features": list(FEATURES),
        "duplicate_bar": judge.duplicate_bar,
        "models": dict(judge.models),
        "provenance": dict(judge.provenance),
        "trees": judge.trees.to_dict(),
        "update_trees": None if judge.updates is None else judge.updates.to_dict(),
        "veto_bar": judge.veto_bar,
    }
    body[SEAL] = manifest_digest({k: v for k, v in body.items() if k != SEAL})
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(body, sort_keys=True, allow_nan=False) + "\n", mode=0o644)
    load_judge(path)  # what we wrote must pass our own check
    return path


class OlderJudge(ModelError):
    """A sound judge file of an earlier ``memgate-judge/N`` format (an upgrade leaves one in
    the cache): the gate skips it with a warning, where a damaged file stops the engine."""


def _older(fmt: str) -> bool:
    name, _, version = fmt.rpartition("/")
    mine = FORMAT.rpartition("/")
    return name == mine[0] and version.isdigit() and int(version) < int(mine[2])


def load_judge(path: Path) -> Judge:
    """Read and verify a judge file; any problem is a :class:`ModelError` naming it."""
    try:
        body = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"judge {path}: unreadable ({exc})") from None
    fmt = body.get("format") if isinstance(body, dict) else None
    if fmt != FORMAT:
        if isinstance(fmt, str) and _older(fmt):
            raise OlderJudge(f"judge {path}: written by an older engine ({fmt}, not {FORMAT})")
        raise ModelError(f"judge {path}: not a {FORMAT} file")
    if body.get(SEAL) != manifest_digest({k: v for k, v in body.items() if k != SEAL}):
        raise ModelError(f"judge {path}: its seal does not match its contents (edited?)")
    if body.get("features") != list(FEATURES):
        raise ModelError(
            f"judge {path}: fitted on other features than this engine computes; fit it again "
            "with `memgate models judge`"
        )
    try:
        return Judge(
            Boost.from_dict(body["trees"]),
            duplicate_bar=float(body["duplicate_bar"]),
            updates=None if body["update_trees"] is None else Boost.from_dict(body["update_trees"]),
            veto_bar=float(body["veto_bar"]),
            models=body.get("models") or {},
            provenance=body.get("provenance") or {},
            seal=str(body[SEAL]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelError(f"judge {path}: malformed ({exc})") from None


def find_judge(cache_dir: Path, embedder: Any, nli: Any) -> Judge | None:
    """The judge fitted for these loaded runtimes, or None (with a warning when one exists for
    other graphs). A tampered or malformed file is a :class:`ModelError`."""
    emb, cls = model_identity(embedder), model_identity(nli)
    path = judge_path(cache_dir, emb, cls)
    if not path.is_file():
        log.info("no judge at %s: the rule decides alone", path)
        return None
    try:
        judge = load_judge(path)
    except OlderJudge as exc:  # an upgrade left it: the rule decides until `make models`
        log.warning("%s: not used; fit it again with `memgate models judge`", exc)
        return None
    fitted = (judge.models.get("embedder"), judge.models.get("nli"))
    if fitted != (emb, cls):
        log.warning(
            "judge %s was fitted with other model graphs (rebuilt since?): not used; "
            "fit it again with `memgate models judge`",
            path,
        )
        return None
    _warn_other_cpu(path, judge)
    return judge


def fitted_elsewhere(provenance: Mapping[str, Any]) -> bool:
    """The judge's provenance names other instruction sets than this CPU's (or none): an int8
    model's scores differ a little between AVX2, VNNI and AMX kernels."""
    return provenance.get("isa") != list(cpu()[1])


def _warn_other_cpu(path: Path, judge: Judge) -> None:
    """Warn of a judge fitted where the CPU had other instruction sets; it is served as it is."""
    if "isa" in judge.provenance and fitted_elsewhere(judge.provenance):
        log.warning(
            "judge %s was fitted on a CPU with other instruction sets (%s; here %s): its bars "
            "were chosen on that CPU's model scores; `memgate models judge --force` refits it "
            "here",
            path,
            judge.provenance.get("cpu", "?"),
            cpu()[0],
        )
