"""``memgate backfill``: load a JSON Lines, CSV or Parquet file through the gate, in file order,
exactly once, resumable after Ctrl-C or ``kill -9``.

Modules: :mod:`~engine.backfill.readers` (files -> records), :mod:`~engine.backfill.rows`
(records -> validated facts with idempotency keys), :mod:`~engine.backfill.job` (batches, the
deciders, audit and checkpoint), :mod:`~engine.backfill.checkpoint`,
:mod:`~engine.backfill.audit`, :mod:`engine.cli.backfill` (the command).
"""

from engine.backfill.job import (
    BackfillSettings,
    EngineDecider,
    GateDecider,
    Job,
    JobResult,
    Source,
    StreamDecider,
    core_settings,
)
from engine.backfill.rows import FieldMap, parse_map

__all__ = [
    "BackfillSettings",
    "EngineDecider",
    "FieldMap",
    "GateDecider",
    "Job",
    "JobResult",
    "Source",
    "StreamDecider",
    "core_settings",
    "parse_map",
]
