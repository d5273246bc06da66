"""The transport-free engine core: the token-budget queue, the batcher, admission and the
:class:`Engine` facade every caller shares (the gRPC service, in-process backfill, eval and
framework adapters through :class:`SyncEngine`).

Layering: ``server`` -> ``core`` -> ``gate``; nothing here imports ``grpc``, and the gate is a
collaborator behind a protocol (:class:`GateLike`).
"""

from __future__ import annotations

from engine.core.admission import Permits
from engine.core.batcher import Batcher, Served
from engine.core.engine import (
    RECALL,
    CoreSettings,
    Engine,
    GateLike,
    ModelDone,
    ModelWork,
    TriageGroup,
    run_model_batch,
    shutdown_message,
)
from engine.core.queue import Batch, Entry, QueueSettings, TokenBudgetQueue, estimate_tokens
from engine.core.results import Recalled, Streamed, Timings, Triaged
from engine.core.stage import Budget, ModelStage, Staged, StageSettings
from engine.core.sync import SyncEngine

__all__ = [
    "RECALL",
    "Batch",
    "Batcher",
    "Budget",
    "CoreSettings",
    "Engine",
    "Entry",
    "GateLike",
    "ModelDone",
    "ModelStage",
    "ModelWork",
    "Permits",
    "QueueSettings",
    "Recalled",
    "Served",
    "StageSettings",
    "Staged",
    "Streamed",
    "SyncEngine",
    "Timings",
    "TokenBudgetQueue",
    "Triaged",
    "TriageGroup",
    "estimate_tokens",
    "run_model_batch",
    "shutdown_message",
]
