"""Prometheus metrics of one server, on their own registry (so tests can run many servers).

``memgate_requests_total{rpc,code}`` and ``memgate_request_seconds{rpc,code}`` per call,
``memgate_batch_facts`` / ``memgate_batch_requests`` per model batch, ``memgate_queue_facts``
(facts waiting for the model), ``memgate_permits_in_use`` and ``memgate_admission_limit``
(admission), ``memgate_decisions_total{action,dry_run}`` (Triage and dry-run Backfill count
with ``dry_run="true"``, so stored decisions are told apart from previews), and
``memgate_build_info{version,embedder,embedder_manifest,nli,nli_manifest,judge}`` (always 1;
the manifest labels are the first 16 hex digits of each model's sealed ``manifest_sha256``, the
judge label those of the judge's ``judge_sha256``, ``none`` without a judge).
The registry also carries the standard ``process_*`` (resident memory, CPU seconds, open file
descriptors, start time) and ``python_info`` collectors, which a private registry does not get
by itself. Exposed over HTTP by :meth:`Metrics.serve` on ``--metrics-port`` (0: off).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)

import engine
from engine.runtime.manifest import DIGEST_KEY, MANIFEST_NAME

__all__ = ["Metrics"]

_LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "memgate_requests", "Calls by RPC and status code.", ["rpc", "code"], registry=r
        )
        self.latency = Histogram(
            "memgate_request_seconds",
            "Call latency as the server saw it, by RPC and status code.",
            ["rpc", "code"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_facts = Histogram(
            "memgate_batch_facts", "Facts per model batch.", buckets=_BATCH_BUCKETS, registry=r
        )
        self.batch_requests = Histogram(
            "memgate_batch_requests",
            "Requests per model batch.",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.queue_facts = Gauge("memgate_queue_facts", "Facts waiting for the model.", registry=r)
        self.permits = Gauge(
            "memgate_permits_in_use",
            "Admission permits held (facts queued or in the model).",
            registry=r,
        )
        self.admission_limit = Gauge(
            "memgate_admission_limit",
            "Facts admitted in flight right now (hard cap, or the queue-delay budget's share).",
            registry=r,
        )
        self.decisions = Counter(
            "memgate_decisions",
            "Gate decisions by action; dry_run=true for Triage and dry-run Backfill.",
            ["action", "dry_run"],
            registry=r,
        )
        self.build_info = Gauge(
            "memgate_build_info",
            "Always 1: the memgate version and the sealed manifests of the models and the "
            "judge served.",
            ["version", "embedder", "embedder_manifest", "nli", "nli_manifest", "judge"],
            registry=r,
        )
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        self._http: Any = None

    def watch(
        self,
        queue_facts: Callable[[], float],
        permits: Callable[[], float],
        admission_limit: Callable[[], float],
    ) -> None:
        """Read the gauges from live state at scrape time."""
        self.queue_facts.set_function(queue_facts)
        self.permits.set_function(permits)
        self.admission_limit.set_function(admission_limit)

    def observe_call(self, rpc: str, code: str, seconds: float) -> None:
        self.requests.labels(rpc, code).inc()
        self.latency.labels(rpc, code).observe(seconds)

    def observe_batch(self, facts: int, requests: int) -> None:
        self.batch_facts.observe(facts)
        self.batch_requests.observe(requests)

    def count_decisions(self, actions: list[str], *, dry_run: bool = False) -> None:
        flag = "true" if dry_run else "false"
        for action in actions:
            self.decisions.labels(action, flag).inc()

    def describe(self, gate: Any) -> None:
        """Set ``memgate_build_info`` from the gate's models (their manifests, when they have
        them: a test double without models reports ``none``)."""
        labels = {"version": engine.__version__}
        for role in ("embedder", "nli"):
            name, digest = _model_labels(getattr(getattr(gate, role, None), "manifest", None))
            labels[role] = name
            labels[f"{role}_manifest"] = digest
        labels["judge"] = str(getattr(getattr(gate, "judge", None), "seal", "") or "none")[:16]
        self.build_info.clear()
        self.build_info.labels(**labels).set(1)

    def serve(self, port: int, host: str = "127.0.0.1") -> int:
        """Expose the registry over HTTP; returns the bound port."""
        server, _thread = start_http_server(port, host, registry=self.registry)
        self._http = server
        return int(server.server_port)

    def close(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


def _model_labels(manifest: Any) -> tuple[str, str]:
    """(``name/variant``, first 16 hex digits of the manifest's seal) of one model."""
    if manifest is None:
        return "none", "none"
    name = f"{manifest.name}/{manifest.variant}"
    try:
        raw = json.loads((Path(manifest.directory) / MANIFEST_NAME).read_text("utf-8"))
        seal = str(raw[DIGEST_KEY])[:16]
    except (OSError, ValueError, KeyError, TypeError):
        seal = "unknown"  # loaded with verify=False from a hand-made directory
    return name, seal
