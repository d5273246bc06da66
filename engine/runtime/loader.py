"""Find, verify and load the installed model artefacts.

Layout: ``<cache_dir>/models/<name>/<variant>/manifest.json``. The cache directory is chosen at
the edge (CLI flag or ``MEMGATE_HOME``) and passed in; nothing here reads the environment.

Model names and variants are plain names, checked when a :class:`ModelChoice` is made; every
directory is checked to resolve inside the cache before it is listed or read, and each manifest
vouches for its files (:mod:`engine.runtime.manifest`). A refused artefact is a
:class:`~engine.errors.ModelError` that says which and why, at start.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from engine.errors import ModelError
from engine.runtime.base import BatchSettings
from engine.runtime.embedder import Embedder
from engine.runtime.layout import artefact_dir, check_name, inside_cache, model_dir
from engine.runtime.manifest import Manifest, load_manifest
from engine.runtime.nli import NLIScorer
from engine.runtime.session import SessionSettings

__all__ = ["EMBEDDER", "NLI_FALLBACK", "NLI_PRIMARY", "ModelChoice", "load_models", "resolve_nli"]

log = logging.getLogger("memgate.runtime")

EMBEDDER = "minilm"
NLI_PRIMARY = "nli-deberta-v3-small"
NLI_FALLBACK = "aegis-nli"


@dataclass(frozen=True)
class ModelChoice:
    """Which artefacts to serve."""

    embedder_variant: str = "fp32"
    """fp32 by default: int8 MiniLM moves which memories clear the similarity floor."""
    nli: str = "auto"
    """``auto``: nli-deberta-v3-small with pretrained weights if built, else the aegis model."""
    nli_variant: str = "auto"
    """``auto``: int8 on CPU, fp16 on CUDA (fp32 when that variant is missing)."""
    allow_random_weights: bool = False
    """Serve a random-initialised NLI model (speed work only: its decisions are noise)."""

    def __post_init__(self) -> None:
        check_name(self.embedder_variant, "embedder variant")
        for value, what in ((self.nli, "NLI model name"), (self.nli_variant, "NLI variant")):
            if value != "auto":
                check_name(value, what)


def _variants(cache_dir: Path, name: str) -> list[str]:
    root = model_dir(cache_dir, name)
    if not root.is_dir():
        return []
    inside_cache(cache_dir, root)
    # Every entry is checked before anything under it is looked at: a variant that links out
    # of the cache is refused even when another one would have been chosen.
    entries = [inside_cache(cache_dir, p) for p in sorted(root.iterdir())]
    return [p.name for p in entries if p.is_dir() and (p / "manifest.json").is_file()]


def _load(cache_dir: Path, name: str, variant: str) -> Manifest:
    """The verified manifest of one artefact inside the cache."""
    return load_manifest(inside_cache(cache_dir, artefact_dir(cache_dir, name, variant)))


def resolve_nli(cache_dir: Path, choice: ModelChoice, device: str) -> Manifest:
    names = [choice.nli] if choice.nli != "auto" else [NLI_PRIMARY, NLI_FALLBACK]
    problems = []
    for name in names:
        variants = _variants(cache_dir, name)
        if not variants:
            problems.append(f"{name}: not built")
            continue
        if choice.nli_variant != "auto":
            order = [choice.nli_variant]
        else:
            order = ["fp16", "fp32"] if device == "cuda" else ["int8", "imported", "fp32"]
        variant = next((v for v in order if v in variants), None)
        if variant is None:
            problems.append(f"{name}: none of {order} built (have {variants})")
            continue
        manifest = _load(cache_dir, name, variant)
        if manifest.weights == "random" and not choice.allow_random_weights:
            problems.append(f"{name}: random-initialised weights (speed work only)")
            continue
        if name != names[0]:
            log.warning(
                "NLI fallback: using %s because %s", manifest.describe(), "; ".join(problems)
            )
        return manifest
    raise ModelError(
        "no usable NLI model: " + "; ".join(problems) + ". Build them with `memgate models build`."
    )


def load_models(
    cache_dir: Path,
    choice: ModelChoice | None = None,
    session: SessionSettings | None = None,
    batching: BatchSettings | None = None,
) -> tuple[Embedder, NLIScorer]:
    """Verify the manifests and load both runtimes."""
    choice = choice or ModelChoice()
    session = session or SessionSettings()
    embedder = Embedder(_load(cache_dir, EMBEDDER, choice.embedder_variant), session, batching)
    nli = NLIScorer(resolve_nli(cache_dir, choice, session.device), session, batching)
    log.info(
        "models: %s + %s on %s",
        embedder.manifest.describe(),
        nli.manifest.describe(),
        session.device,
    )
    return embedder, nli
