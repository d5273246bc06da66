"""Factories at the edge: build a ready :class:`OpenedEngine` from a data directory and a model
cache, and the batching core (:class:`engine.core.Engine`) over a gate."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from engine.core import CoreSettings, SyncEngine
from engine.core import Engine as CoreEngine
from engine.core.stage import ModelStage, Staged
from engine.gate.gate import Gate, GateSettings, validate_fact
from engine.gate.judge.store import find_judge
from engine.gate.policy import policy_by_name
from engine.index import IndexManager, IndexSettings
from engine.runtime.base import BatchSettings
from engine.runtime.layout import DEFAULT_CACHE_DIR
from engine.runtime.loader import ModelChoice, load_models
from engine.runtime.session import SessionSettings
from engine.store import StoreSettings, open_store

__all__ = ["EngineSettings", "OpenedEngine", "build_engine", "open_engine"]

log = logging.getLogger("memgate")


@dataclass(frozen=True)
class EngineSettings:
    data_dir: Path = Path("memgate-data")
    """Where the store (memgate.db) lives, and its index snapshots (``index/``)."""
    cache_dir: Path = DEFAULT_CACHE_DIR
    """Where built model artefacts live (``memgate models build``)."""
    models: ModelChoice = field(default_factory=ModelChoice)
    session: SessionSettings = field(default_factory=SessionSettings)
    batching: BatchSettings = field(default_factory=BatchSettings)
    gate: GateSettings = field(default_factory=GateSettings)
    index: IndexSettings = field(default_factory=IndexSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    store_spec: str | None = None
    """The store: None for ``memgate.db`` in ``data_dir`` (SQLite), or a ``postgresql://``
    DSN shared by several replicas (``--store`` / ``MEMGATE_STORE``). Index snapshots stay
    per replica, in ``data_dir``."""
    judge: bool = True
    """Load the judge fitted for the served models (``memgate models judge``) when
    the cache holds one; without it the gate's rule decides alone."""
    nli_sub_batch: int | None = None
    """Pairs per NLI forward pass: None measures the fastest size on this machine once and
    keeps it next to the NLI manifest (``engine.runtime.tuning``); a number overrides it
    (``--nli-sub-batch``)."""
    snapshots: bool = True
    """Snapshot large namespace indexes into ``index/`` next to the store, so a restart loads
    them (verified, reconciled) instead of rebuilding; ``IndexSettings.snapshot_min_vectors``
    says how large."""


def build_engine(
    gate: Any, settings: CoreSettings | None = None, *, exact_tokens: bool = True, **hooks: Any
) -> CoreEngine:
    """The batching core over ``gate``, with the gate's own rule and policy and the embedder's
    tokenizer wired in: the core checks each fact (``validate_fact``), resolves the policy
    once (``gate.policy``: named policy, model thresholds, judge bars, overrides) and
    tokenises each text once (``encode_items``: real token counts for the batch budget, and
    the encodings for the model call; ``exact_tokens=False``: the len/4 estimate), and the gate
    takes all three as they are. ``hooks``: ``on_dead``, ``on_batch``."""
    gate_settings = getattr(gate, "settings", None) or GateSettings()
    policy = getattr(gate, "policy", None)
    encode = getattr(getattr(gate, "embedder", None), "encode_items", None)
    stage = ModelStage((settings or CoreSettings()).stage)
    models = stage_models(gate, stage)
    return CoreEngine(
        gate,
        settings,
        validate=partial(validate_fact, settings=gate_settings),
        check_policy=policy if callable(policy) else _check_named,
        tokenizer=encode if exact_tokens and callable(encode) else None,
        stage=stage,
        warm=None if models is None else lambda: warm_models(*models),
        **hooks,
    )


def _check_named(name: str, overrides: Mapping[str, Any]) -> None:
    """A gate without its own :meth:`Gate.policy`: refuse what ``policy_by_name`` would; the
    gate resolves the policy itself (None)."""
    policy_by_name(name).with_overrides(dict(overrides))


def _innermost(gate: Any) -> Any:
    """The gate under its wrappers (``PolicyFileGate`` and test wrappers keep it in ``_gate``)."""
    seen = 0
    while "_gate" in getattr(gate, "__dict__", {}) and seen < 16:
        gate = gate.__dict__["_gate"]
        seen += 1
    return gate


def stage_models(gate: Any, stage: ModelStage) -> tuple[Any, Any] | None:
    """Route the gate's embedder and NLI forwards to ``stage``'s model thread (a model already
    staged by an earlier engine moves to this one). Returns the staged (embedder, nli), or None
    for a gate without both."""
    inner = _innermost(gate)
    embedder, nli = getattr(inner, "embedder", None), getattr(inner, "nli", None)
    if embedder is None or nli is None:
        return None
    inner.embedder = Staged(getattr(embedder, "wrapped", embedder), stage)
    inner.nli = Staged(getattr(nli, "wrapped", nli), stage)
    return inner.embedder, inner.nli


WARM_TEXTS = 8
"""Texts in the warm-up's embedder batch."""
WARM_PAIRS = 32
"""Pairs in the warm-up's NLI batch (the call size ``bench_runtime`` measures)."""
PAIRS_PER_FACT = 4
"""NLI pairs a fact is assumed to cost until real batches are measured: about the mean that
``bench_grpc`` measures on memory-like data (3.95 pairs a fact; a policy sends at most
``top_k`` = 20, a fact of an empty namespace none). The first real batches replace it within a
few calls (a moving average)."""


def warm_models(embedder: Any, nli: Any) -> float:
    """One batch through each model (on the model stage, when staged) and the model seconds
    per fact they imply: an embedding plus ``PAIRS_PER_FACT`` NLI pairs."""
    import time

    texts = [f"Warm-up fact {i}: the model stage runs before serving." for i in range(WARM_TEXTS)]
    embedder.embed(texts[:1])  # lazy initialisation is not what a fact costs
    nli.score([(texts[0], texts[1])])
    t0 = time.perf_counter()
    embedder.embed(texts)
    t1 = time.perf_counter()
    nli.score([(texts[i % WARM_TEXTS], texts[(i + 1) % WARM_TEXTS]) for i in range(WARM_PAIRS)])
    t2 = time.perf_counter()
    return (t1 - t0) / WARM_TEXTS + (t2 - t1) / WARM_PAIRS * PAIRS_PER_FACT


@dataclass
class OpenedEngine:
    gate: Gate[Any, Any]
    settings: EngineSettings

    def sync(self, settings: CoreSettings | None = None) -> SyncEngine:
        """A started, blocking batching core over this gate (close it before this engine)."""
        return SyncEngine(build_engine(self.gate, settings))

    def close(self) -> None:
        """Snapshot the loaded indexes (graceful shutdown), then close the store."""
        try:
            self.gate.index.close()
        finally:
            self.gate.store.close()

    def __enter__(self) -> OpenedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_engine(settings: EngineSettings, *, db_path: Path | None = None) -> OpenedEngine:
    embedder, nli = load_models(
        settings.cache_dir, settings.models, settings.session, settings.batching
    )
    embedder.warmup()
    nli.warmup()
    from engine.runtime.tuning import tune_nli

    sub_batch = tune_nli(nli, settings.nli_sub_batch)
    log.info("NLI sub-batch: %d pairs per forward pass", sub_batch)
    path = db_path or Path(settings.data_dir) / "memgate.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    # A postgresql:// DSN (settings.store_spec) is shared by replicas: indexes follow its log.
    store = open_store(db_path or settings.store_spec or path, settings.store)
    follow = store if getattr(store, "shared", False) else None
    if settings.snapshots:
        # Next to the data they derive from; the server verifies them before SERVING.
        index = IndexManager(
            store.iter_active_embeddings,
            settings.index,
            snapshot_dir=path.parent / "index",
            source=store,
            follow=follow,
        )
    else:
        index = IndexManager(store.iter_active_embeddings, settings.index, follow=follow)
    judge = find_judge(settings.cache_dir, embedder, nli) if settings.judge else None
    if judge is not None:
        log.info("%s (bars %.2f / %.2f)", judge.describe(), judge.duplicate_bar, judge.veto_bar)
    return OpenedEngine(Gate(store, index, embedder, nli, settings.gate, judge), settings)
