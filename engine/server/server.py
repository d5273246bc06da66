"""The grpc.aio server: wiring of the engine core, interceptor, health and metrics.

:class:`MemgateServer` is the async object (start / stop on the caller's loop);
:func:`serve` runs one until SIGINT or SIGTERM (``memgate serve``); :class:`ServerThread`
runs one on a private loop in a background thread (tests, benchmarks, embedding in a
synchronous program).

Shutdown keeps its word (``stop``): health turns NOT_SERVING and Health.Watch streams end with
UNAVAILABLE; new calls are refused with UNAVAILABLE; streams stop reading new facts, deliver what
commits within the grace period and end with UNAVAILABLE naming their last committed fact; no
model call starts that would not end within the grace; then the listener, the engine and the
threads stop.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from engine.app import build_engine
from engine.core import (
    Batcher,
    CoreSettings,
    ModelDone,
    ModelWork,
    Permits,
    QueueSettings,
    StageSettings,
)
from engine.errors import InvalidInput, StorageError, Unavailable
from engine.server.auth import Auth
from engine.server.convert import Limits
from engine.server.interceptor import ServiceInterceptor
from engine.server.metrics import Metrics
from engine.server.proto import SERVICE_NAME, pb_grpc
from engine.server.service import MemgateService

__all__ = ["MemgateServer", "ServerSettings", "ServerThread", "serve"]

log = logging.getLogger("memgate.server")

T = TypeVar("T")

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass(frozen=True)
class ServerSettings:
    """Everything ``memgate serve`` can be told. Every field is range-checked."""

    host: str = "127.0.0.1"
    """Address to bind; ``0.0.0.0`` or ``[::]`` to listen on every interface."""
    port: int | None = 50051
    """Port to bind; 0 picks a free one (see :attr:`MemgateServer.port`); None: no gRPC
    listener (an in-process door only, as ``memgate mcp`` over stdio)."""
    max_request_facts: int = 256
    """Most facts in one Triage or Write request (more: INVALID_ARGUMENT)."""
    limits: Limits = field(default_factory=Limits)
    """Text and metadata size limits, checked before decoding."""
    max_message_bytes: int = 16 << 20
    """gRPC receive/send message size limit."""
    max_queued_facts: int = 1024
    """Admission permits: facts queued or in the model at once (TEI's max concurrent
    requests). Beyond it, RESOURCE_EXHAUSTED; inside it requests queue and their own deadlines
    decide (an expired one is dropped before the model with DEADLINE_EXCEEDED)."""
    max_queue_delay_s: float | None = None
    """Optionally also bound the facts in flight by what the worker finishes in this many
    seconds at its measured rate. Off by default (docs/experiments/2026-12-05-default-door.md):
    at 1 s it refused 78% of the calls of a 32-client closed loop whose clients carried 30 s
    deadlines, at 0.1-0.5 s it also shed at half the capacity. None: ``max_queued_facts``
    only."""
    min_admitted_facts: int = 16
    """The queue-delay budget never tightens the bound below this many facts in flight: enough
    for a useful batch when the machine is slow or busy."""
    admit_by_deadline: bool = True
    """Refuse with RESOURCE_EXHAUSTED, at once, a request whose deadline the queue ahead of it
    cannot meet at the measured rate (instead of queueing it to fail with DEADLINE_EXCEEDED)."""
    batching: QueueSettings = field(default_factory=QueueSettings)
    backfill_window: int = 256
    """Most facts of one Backfill stream in flight (queued or in the model)."""
    io_threads: int = 4
    """Threads for store work (Get, History, Forget, Undo, reviews)."""
    expiry_interval_s: float | None = 60.0
    """How often the expiry sweep runs (``CoreSettings.expiry_interval_s``); None: never."""
    lanes: int = 8
    """Batches of different namespaces that run at once (``CoreSettings.lanes``): one
    namespace waiting on a lock held elsewhere holds up no other."""
    stall_s: float = 30.0
    """Health turns NOT_SERVING when work has waited this long on the model thread without a
    forward finishing (``CoreSettings.stall_s``)."""
    stage: StageSettings = field(default_factory=StageSettings)
    """The model stage's token budgets per model (``CoreSettings.stage``)."""
    grace_s: float = 10.0
    """On shutdown, how long in-flight calls may run before they are cancelled."""
    reflection: bool = False
    """Serve gRPC reflection (grpcurl, evans)."""
    metrics_port: int = 0
    """Prometheus metrics over HTTP on this port; 0: off."""
    metrics_host: str = "127.0.0.1"
    tls_cert: bytes | None = None
    """PEM certificate chain; with ``tls_key``, the port speaks TLS only."""
    tls_key: bytes | None = None
    exact_tokens: bool = True
    """Count the batch budget with the embedder's tokenizer (real token counts); False: the
    len/4 estimate, which costs no tokenizer call at the door."""
    http_port: int | None = None
    """Serve HTTP/JSON (``engine.server.http``, the ``http`` extra) on this port of ``host``, next
    to gRPC on the same engine; 0 picks a free one; None: off."""
    mcp: bool = False
    """Mount the MCP server (streamable HTTP, the ``mcp`` extra) at ``/mcp`` on the HTTP port."""
    mcp_namespace: str = ""
    """MCP over HTTP: the namespace of a session that sends no ``x-memgate-namespace`` header
    (either way it must be inside the bearer token's prefixes); empty: the header is required."""

    def __post_init__(self) -> None:
        checks = [
            (self.port is None or 0 <= self.port <= 65535, "port must be in [0, 65535]"),
            (
                self.http_port is None or 0 <= self.http_port <= 65535,
                "http_port must be in [0, 65535]",
            ),
            (
                not self.mcp or self.http_port is not None,
                "mcp needs http_port (it is served there)",
            ),
            (1 <= self.max_request_facts <= 100_000, "max_request_facts must be in [1, 100000]"),
            (
                1 << 10 <= self.max_message_bytes <= 1 << 30,
                "max_message_bytes must be in [1 KiB, 1 GiB]",
            ),
            (1 <= self.max_queued_facts <= 10_000_000, "max_queued_facts must be in [1, 10000000]"),
            (
                self.max_queued_facts >= self.max_request_facts,
                "max_queued_facts must be at least max_request_facts, or a full request never fits",
            ),
            (1 <= self.backfill_window <= 100_000, "backfill_window must be in [1, 100000]"),
            (
                1 <= self.min_admitted_facts <= 10_000_000,
                "min_admitted_facts must be in [1, 10000000]",
            ),
            (1 <= self.io_threads <= 256, "io_threads must be in [1, 256]"),
            (1 <= self.lanes <= 256, "lanes must be in [1, 256]"),
            (0.1 <= self.stall_s <= 3600.0, "stall_s must be in [0.1, 3600] seconds"),
            (0.0 <= self.grace_s <= 3600.0, "grace_s must be in [0, 3600]"),
            (0 <= self.metrics_port <= 65535, "metrics_port must be in [0, 65535]"),
            (
                self.max_queue_delay_s is None or 0.0 < self.max_queue_delay_s <= 3600.0,
                "max_queue_delay_s must be in (0, 3600] seconds, or None",
            ),
            ((self.tls_cert is None) == (self.tls_key is None), "tls_cert and tls_key go together"),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidInput(message)


class _Health(health_aio.HealthServicer):  # type: ignore[misc]
    """grpc's health servicer, whose Watch streams end with UNAVAILABLE on shutdown (left to
    the server's stop they are cut, and clients read INTERNAL)."""

    def __init__(self) -> None:
        super().__init__()
        self._ending: asyncio.Event | None = None

    async def Watch(self, request: Any, context: Any) -> None:  # noqa: N802
        if self._ending is None:
            self._ending = asyncio.Event()
        if self._ending.is_set():
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is shutting down")
        watch = asyncio.ensure_future(super().Watch(request, context))
        ending = asyncio.ensure_future(self._ending.wait())
        try:
            await asyncio.wait({watch, ending}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ending.cancel()
        if watch.done():
            return watch.result()  # type: ignore[no-any-return]
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        await context.abort(grpc.StatusCode.UNAVAILABLE, "the server is shutting down")

    async def end_watches(self) -> None:
        """After NOT_SERVING went out to the watchers, end their streams with UNAVAILABLE."""
        await asyncio.sleep(0.05)  # let the watchers write NOT_SERVING first
        if self._ending is None:
            self._ending = asyncio.Event()
        self._ending.set()


def core_settings(s: ServerSettings) -> CoreSettings:
    """The engine core a server with settings ``s`` runs (also what an in-process caller uses
    to compare with the served path on equal terms)."""
    return CoreSettings(
        batching=s.batching,
        max_queued_facts=s.max_queued_facts,
        max_queue_delay_s=s.max_queue_delay_s,
        min_admitted_facts=s.min_admitted_facts,
        admit_by_deadline=s.admit_by_deadline,
        stream_window=s.backfill_window,
        io_threads=s.io_threads,
        expiry_interval_s=s.expiry_interval_s,
        lanes=s.lanes,
        stall_s=s.stall_s,
        stage=s.stage,
    )


class MemgateServer:
    """One gRPC server over one gate. Create, ``await start()``, ``await stop()``, on one loop."""

    def __init__(
        self,
        gate: Any,
        settings: ServerSettings | None = None,
        *,
        tokens: Mapping[str, Sequence[str]] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.gate = gate
        self.settings = settings or ServerSettings()
        s = self.settings
        gate_max = int(getattr(getattr(gate, "settings", None), "max_batch", 1 << 30))
        if max(s.max_request_facts, s.batching.max_batch_facts) > gate_max:
            raise InvalidInput(
                "max_request_facts and max_batch_facts must not exceed the gate's max_batch "
                f"({gate_max})"
            )
        self.auth = Auth(tokens)
        self.metrics = metrics or Metrics()
        self._interceptor = ServiceInterceptor(SERVICE_NAME, self.auth, self.metrics)
        self.health = _Health()
        self.port: int | None = None
        self.http_port: int | None = None
        self.metrics_port: int | None = None
        self.service: MemgateService | None = None
        self._http: Any = None
        self._health_status = NOT_SERVING
        self._server: grpc.aio.Server | None = None
        self._stopping: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._store_watch: asyncio.Task[None] | None = None
        self.engine = build_engine(
            gate,
            core_settings(s),
            exact_tokens=s.exact_tokens,
            on_dead=self._worker_died,
            on_batch=self._batch_done,
        )

    @property
    def batcher(self) -> Batcher[ModelWork, ModelDone]:
        return self.engine.batcher

    @property
    def permits(self) -> Permits:
        return self.engine.permits

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> int:
        """Check the index snapshots, bind, start serving, and return the bound port."""
        s = self.settings
        self._loop = asyncio.get_running_loop()
        await self._recover_index()
        if not self.auth.enabled:
            log.warning("no tokens file: authentication is OFF, every namespace is open")
        await self.engine.start()
        # One batch through every model before SERVING: a cold first call costs many times a
        # warm one, and the admission estimate starts from what the models really cost.
        per_fact = await self.engine.warm_up()
        if per_fact is not None:
            log.info("models warm", extra={"fields": {"model_s_per_fact": round(per_fact, 5)}})
        service = self.service = MemgateService(
            self.engine,
            limits=s.limits,
            max_request_facts=s.max_request_facts,
            metrics=self.metrics,
        )
        if s.port is not None:
            await self._start_grpc(service)
        self.metrics.watch(
            lambda: self.engine.pending_facts,
            lambda: self.engine.permits.in_use,
            lambda: self.engine.permits.current_limit,
        )
        self.metrics.describe(self.gate)
        if s.metrics_port:
            self.metrics_port = self.metrics.serve(s.metrics_port, s.metrics_host)
        if s.http_port is not None:
            await self._start_http(service)
        for name in ("", SERVICE_NAME):
            await self._set_health(name, SERVING)
        self._watch()
        log.info(
            "serving",
            extra={
                "fields": {
                    "address": f"{s.host}:{self.port}",
                    "http_port": self.http_port,
                    "mcp": s.mcp,
                    "tls": s.tls_cert is not None,
                    "auth": self.auth.enabled,
                    "metrics_port": self.metrics_port,
                }
            },
        )
        return self.port or 0

    def door(self, name: str) -> Any:
        """A :class:`engine.server.door.Door` onto this server's handlers (after start)."""
        from engine.server.door import Door

        if self.service is None:
            raise Unavailable("the server is not started")
        return Door(self.service, self._interceptor, name)

    async def _start_http(self, service: MemgateService) -> None:
        s = self.settings
        try:
            from engine.server.http import HttpDoor, build_app
        except ImportError as exc:
            raise InvalidInput(str(exc)) from exc
        mcp = None
        if s.mcp:
            try:
                from engine.server.mcp import http_app
            except ImportError as exc:
                raise InvalidInput(str(exc)) from exc
            mcp = http_app(self.door("mcp"), default_namespace=s.mcp_namespace, host=s.host)
        app = build_app(
            self.door("http"),
            health=lambda: self._health_status == SERVING and self.serving,
            max_body_bytes=s.max_message_bytes,
            mcp=mcp,
            auth=self.auth,
        )
        self._http = HttpDoor(
            app, host=s.host, port=s.http_port or 0, tls_cert=s.tls_cert, tls_key=s.tls_key
        )
        self.http_port = await self._http.start()

    async def _set_health(self, name: str, status: Any) -> None:
        if name == "":
            self._health_status = status
        await self.health.set(name, status)

    async def _start_grpc(self, service: MemgateService) -> None:
        s = self.settings
        options = [
            ("grpc.max_receive_message_length", s.max_message_bytes),
            ("grpc.max_send_message_length", s.max_message_bytes),
            ("grpc.so_reuseport", 0),
        ]
        server = grpc.aio.server(interceptors=[self._interceptor], options=options)
        pb_grpc.add_MemgateServicer_to_server(service, server)  # type: ignore[no-untyped-call]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        if s.reflection:
            from engine.server.reflection import enable_reflection

            health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
            enable_reflection(server, (SERVICE_NAME, health_name))
        address = f"{s.host}:{s.port}"
        if s.tls_cert is not None and s.tls_key is not None:
            creds = grpc.ssl_server_credentials([(s.tls_key, s.tls_cert)])
            self.port = server.add_secure_port(address, creds)
        else:
            self.port = server.add_insecure_port(address)
        if not self.port:
            raise InvalidInput(f"could not bind {address}")
        await server.start()
        self._server = server

    async def stop(self, grace: float | None = None) -> None:
        """Drain within ``grace`` seconds (default: settings), keeping the shutdown contract
        (module docstring); calls still running after it are cancelled. Idempotent: a second
        call waits for the first."""
        if self._stopping is None:
            self._stopping = asyncio.get_running_loop().create_task(self._stop(grace))
        await asyncio.shield(self._stopping)

    async def _stop(self, grace: float | None) -> None:
        grace = self.settings.grace_s if grace is None else grace
        if self._store_watch is not None:
            self._store_watch.cancel()
        loop = asyncio.get_running_loop()
        end = loop.time() + grace
        await self.health.enter_graceful_shutdown()
        # Model calls must end, and their answers go out, before the grace does: no batch
        # starts that would end after the cutoff, and a stream waits for one still committing
        # at the cutoff for most of the margin that is left before the grace ends.
        margin = min(1.0, grace / 4)
        self.engine.stop_streams(end - margin, tail=0.75 * margin)
        await self.health.end_watches()
        drained = await self._interceptor.drain(max(0.0, end - loop.time()))
        log.info(
            "draining",
            extra={"fields": {"drained": drained, "in_flight": self._interceptor.in_flight}},
        )
        if self._http is not None:
            await self._http.stop()
        if self._server is not None:
            await self._server.stop(0.5 if drained else 0)
        await self.engine.close()
        await self._snapshot_index()
        self.metrics.close()
        log.info("stopped")

    async def _recover_index(self) -> None:
        """Verify and reconcile (or quarantine) the index snapshots on disk before the port is
        bound, so nothing is served, and health cannot say SERVING, before they are checked.
        A bad snapshot never fails the start; a failing store does (fail-stop)."""
        recover = getattr(getattr(self.gate, "index", None), "recover", None)
        if recover is None:
            return
        try:
            await self.engine.run_io(recover)
        except StorageError:
            raise
        except Exception as exc:  # noqa: BLE001 - every load verifies its snapshot again
            log.error(
                "index snapshot recovery failed; namespaces load from the store on first use",
                extra={"fields": {"error": type(exc).__name__}},
            )

    async def _snapshot_index(self) -> None:
        """Graceful shutdown: snapshot the loaded indexes (the calls have drained)."""
        close = getattr(getattr(self.gate, "index", None), "close", None)
        if close is None:
            return
        try:
            await asyncio.to_thread(close)
        except Exception as exc:  # noqa: BLE001 - a snapshot is a cache; the store has it all
            log.warning(
                "could not snapshot the indexes on shutdown",
                extra={"fields": {"error": type(exc).__name__}},
            )

    async def wait(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()
        else:
            await asyncio.Event().wait()  # no gRPC listener: until cancelled

    @property
    def serving(self) -> bool:
        return self._stopping is None and self.engine.alive

    def _batch_done(self, facts: int, entries: int, seconds: float) -> None:
        self.metrics.observe_batch(facts, entries)

    def _watch(self) -> None:
        """Health follows what can come back by itself (every 0.5 s):

        * a store on a database server (PostgreSQL) can be lost and return: NOT_SERVING while
          it does not answer (``StoreUnreachable``, retryable; a failed disk stays fail-stop);
        * the model thread can stall: NOT_SERVING while work has waited on it for
          ``CoreSettings.stall_s`` without a forward finishing (a wedged runtime, a starved
          machine), SERVING again once forwards finish."""
        ping = getattr(getattr(self.gate, "store", None), "ping", None)

        async def watch() -> None:
            serving = True
            while self._stopping is None and self.engine.alive:
                store_up = True if ping is None else await asyncio.to_thread(ping, 1.0)
                stalled = self.engine.stalled
                up = store_up and not stalled
                if up != serving and self._stopping is None and self.engine.alive:
                    serving = up
                    if up:
                        log.warning("serving again")
                    else:
                        why = "store unreachable" if not store_up else "model stage stalled"
                        log.warning("%s; NOT_SERVING", why)
                    for name in ("", SERVICE_NAME):
                        await self._set_health(name, SERVING if up else NOT_SERVING)
                await asyncio.sleep(0.5)

        self._store_watch = asyncio.get_running_loop().create_task(watch())

    def _worker_died(self, exc: BaseException) -> None:
        log.error("the engine stopped (fail-stop); health is NOT_SERVING until restart")
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        for name in ("", SERVICE_NAME):
            task = loop.create_task(self._set_health(name, NOT_SERVING))
            self._background.add(task)
            task.add_done_callback(self._background.discard)


def serve(
    gate: Any, settings: ServerSettings, *, tokens: Mapping[str, Sequence[str]] | None = None
) -> int:
    """Serve until SIGINT or SIGTERM, then drain for ``settings.grace_s``. Blocking."""

    async def main() -> None:
        server = MemgateServer(gate, settings, tokens=tokens)
        await server.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        waiter = loop.create_task(server.wait())
        stopper = loop.create_task(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        log.info("shutting down", extra={"fields": {"grace_s": settings.grace_s}})
        await server.stop()
        for task in (waiter, stopper):
            task.cancel()

    asyncio.run(main())
    return 0


class ServerThread:
    """A :class:`MemgateServer` on its own event loop in a daemon thread.

    ``with ServerThread(gate, settings) as st: MemgateClient(st.target)...``; ``stop(grace)``
    drains like the real thing. :meth:`call` runs a coroutine on the server's loop.
    """

    def __init__(
        self,
        gate: Any,
        settings: ServerSettings | None = None,
        *,
        tokens: Mapping[str, Sequence[str]] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="memgate-server", daemon=True
        )
        self._build: Callable[[], MemgateServer] = lambda: MemgateServer(
            gate, settings, tokens=tokens, metrics=metrics
        )
        self.server: MemgateServer | None = None
        self.port: int | None = None

    @property
    def target(self) -> str:
        assert self.server is not None and self.port is not None
        return f"{self.server.settings.host}:{self.port}"

    def start(self) -> int:
        self._thread.start()

        async def boot() -> int:
            self.server = self._build()
            return await self.server.start()

        self.port = self.call(boot)
        return self.port

    def call(self, fn: Callable[[], Coroutine[Any, Any, T]], timeout: float | None = 60) -> T:
        """Run ``fn()`` on the server loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(timeout)

    def stop_async(self, grace: float | None = None) -> Any:
        """Begin a graceful stop; returns a ``concurrent.futures.Future`` that ends with it."""
        assert self.server is not None
        server = self.server
        return asyncio.run_coroutine_threadsafe(server.stop(grace), self._loop)

    def stop(self, grace: float | None = 0.0, timeout: float | None = 120) -> None:
        """Drain (``grace`` seconds), cancel what is left on the loop, and end the thread."""
        if not self._thread.is_alive():
            return
        if self.server is not None:
            self.stop_async(grace).result(timeout)

        async def sweep() -> None:
            me = asyncio.current_task()
            rest = [t for t in asyncio.all_tasks() if t is not me]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
            await self._loop.shutdown_asyncgens()

        self.call(sweep, timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
