"""The one interceptor every memgate call goes through.

For each call to ``memgate.v1.Memgate`` (health and reflection pass untouched) it

1. gives the call a request id (the client's ``x-request-id`` when it is sane, else a fresh one)
   and sends it back at once in the initial metadata (so a client has it before the first
   response, and a stream cut halfway still told it), and again in the trailing metadata;
   while the server drains, refuses the call (UNAVAILABLE);
2. authenticates the token (``engine.server.auth``) and puts a :class:`Call` in a context
   variable, where handlers find the principal to authorise namespaces against;
3. maps every exception to a status through the one table (``engine.server.status``):
   a :class:`~engine.errors.MemgateError` to its row, anything else to INTERNAL with the request
   id only, its traceback logged server-side under the same id;
4. records the call: request counter and latency histogram per RPC and code, and one JSON
   access-log line (rpc, code, ms, request id, facts count; never texts).

Handlers therefore hold no ``try/except``: they raise domain errors and return messages.

The HTTP/JSON and MCP doors (``engine.server.http``, ``engine.server.mcp``) call the same
handlers through the same steps: :meth:`ServiceInterceptor.open_call`,
:meth:`~ServiceInterceptor.admit`, :meth:`~ServiceInterceptor.describe_failure` and
:meth:`~ServiceInterceptor.close_call`, so draining, auth, the status table, metrics and the
access log are one code path whichever door a call came through.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import grpc

from engine.errors import InvalidInput, MemgateError, Unavailable
from engine.server.auth import Auth, Principal
from engine.server.convert import check_decoded, guard_deserializer
from engine.server.logs import access_logger
from engine.server.metrics import Metrics
from engine.server.status import Rule, rule_for

__all__ = ["Call", "ServiceInterceptor", "current_call"]

log = logging.getLogger("memgate.server")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
_CANCELLED = Rule(grpc.StatusCode.CANCELLED, 499, False, "the call was cancelled")


@dataclass
class Call:
    """What the interceptor knows about one call; handlers add the facts count."""

    rpc: str
    request_id: str
    principal: Principal = field(default_factory=lambda: Principal(()))
    facts: int = 0
    code: grpc.StatusCode = grpc.StatusCode.OK
    started: float = field(default_factory=time.perf_counter)
    door: str = "grpc"
    """Which door the call came through: grpc, http or mcp (the access log says it)."""
    closed: bool = False

    def authorize(self, namespace: str) -> None:
        self.principal.authorize(namespace)


_CURRENT: ContextVar[Call] = ContextVar("memgate_call")


def current_call() -> Call:
    """The call being handled (set by the interceptor before the handler runs)."""
    return _CURRENT.get()


class ServiceInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # grpc has no types
    """``lame_duck_s``: after a drain emptied the server, how long it goes on refusing new calls
    with UNAVAILABLE before :meth:`drain` returns and the listener closes (within the grace)."""

    def __init__(
        self,
        service: str,
        auth: Auth,
        metrics: Metrics | None = None,
        *,
        lame_duck_s: float = 0.25,
    ) -> None:
        if not 0.0 <= lame_duck_s <= 60.0:
            raise InvalidInput(f"lame_duck_s must be in [0, 60] seconds, got {lame_duck_s}")
        self._lame_duck_s = lame_duck_s
        self._prefix = f"/{service}/"
        self._auth = auth
        self._metrics = metrics
        self._wrapped: dict[str, grpc.RpcMethodHandler] = {}
        self._in_flight = 0
        self._draining = False
        self._idle: asyncio.Event | None = None

    # -- draining -------------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return self._in_flight

    async def drain(self, grace: float) -> bool:
        """Refuse new calls with UNAVAILABLE (retryable, unlike grpc's own CANCELLED for calls
        that arrive after ``server.stop``) and wait up to ``grace`` seconds for the calls in
        flight. True when they all finished.

        Then, while the grace lasts, go on refusing for ``lame_duck_s``: a client whose call was
        answered by the drain typically sends its next one at once, and a call that reaches the
        server in the instant its listener closes is cancelled by gRPC itself (CANCELLED, which
        clients do not retry). After the lame-duck period such a client has had its retryable
        UNAVAILABLE and gone elsewhere."""
        self._draining = True
        loop = asyncio.get_running_loop()
        end = loop.time() + grace
        if self._in_flight:
            self._idle = asyncio.Event()
            try:
                async with asyncio.timeout(grace):
                    await self._idle.wait()
            except TimeoutError:
                return False
        linger = min(self._lame_duck_s, end - loop.time())
        if linger > 0:
            await asyncio.sleep(linger)
        return True

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method: str = handler_call_details.method
        handler = await continuation(handler_call_details)
        if handler is None or not method.startswith(self._prefix):
            return handler
        wrapped = self._wrapped.get(method)
        if wrapped is None:
            wrapped = self._wrapped[method] = self._wrap(method[len(self._prefix) :], handler)
        return wrapped

    # -- wrapping -------------------------------------------------------------------------------
    def _wrap(self, rpc: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        kw = {
            "request_deserializer": guard_deserializer(handler.request_deserializer),
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(self._unary(rpc, handler.unary_unary), **kw)
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(
                self._stream(rpc, handler.stream_stream), **kw
            )
        raise TypeError(f"{rpc}: only unary-unary and stream-stream methods are wrapped")

    def _unary(self, rpc: str, behavior: Any) -> Any:
        async def handle(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with self._guard(rpc, context):
                return await behavior(check_decoded(request), context)

        return handle

    def _stream(self, rpc: str, behavior: Any) -> Any:
        async def handle(requests: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async with self._guard(rpc, context):
                async for response in behavior(_checked(requests), context):
                    yield response

        return handle

    @asynccontextmanager
    async def _guard(self, rpc: str, context: grpc.aio.ServicerContext) -> AsyncIterator[Call]:
        """Around one handler: begin, refuse while draining, authenticate; map any failure to
        its status; end (metrics, access log)."""
        metadata = context.invocation_metadata() or ()
        call = self.open_call(rpc, next((v for k, v in metadata if k == "x-request-id"), None))
        context.set_trailing_metadata((("x-request-id", call.request_id),))
        try:
            await context.send_initial_metadata((("x-request-id", call.request_id),))
            self.admit(call, metadata)
            yield call
        except BaseException as exc:
            await self._fail(call, exc, context)
            raise
        finally:
            self.close_call(call)

    # -- the steps, for every door --------------------------------------------------------------
    def open_call(self, rpc: str, request_id: object = None, *, door: str = "grpc") -> Call:
        """Begin a call: count it in flight, give it a request id (``request_id`` when it is
        sane, else a fresh one) and make it :func:`current_call`. Pair with
        :meth:`close_call`."""
        self._in_flight += 1
        rid = request_id
        if not isinstance(rid, str) or not _REQUEST_ID.match(rid):
            rid = secrets.token_hex(8)
        call = Call(rpc, rid, door=door)
        _CURRENT.set(call)
        return call

    def admit(self, call: Call, metadata: Iterable[tuple[str, str | bytes]]) -> None:
        """Refuse the call while draining (``Unavailable``); authenticate its token."""
        if self._draining:
            raise Unavailable("the server is draining; retry on another replica")
        call.principal = self._auth.authenticate(metadata)

    def describe_failure(self, call: Call, exc: BaseException) -> tuple[Rule, str]:
        """The table's row for ``exc`` and the message the client may read; records the code
        on ``call``. Anything not public (an unknown error, a model or storage failure) is
        logged here with its traceback and answered with a fixed sentence and the request id.
        A cancelled call is recorded as CANCELLED (no client is left to answer)."""
        if isinstance(exc, asyncio.CancelledError | GeneratorExit):
            call.code = grpc.StatusCode.CANCELLED
            return _CANCELLED, "the call was cancelled"
        rule = rule_for(exc)
        call.code = rule.code
        if isinstance(exc, MemgateError) and rule.public:
            return rule, str(exc)
        log.error(
            "%s failed: %s",
            call.rpc,
            type(exc).__name__,
            exc_info=exc,
            extra={"fields": {"rpc": call.rpc, "request_id": call.request_id}},
        )
        return rule, f"{rule.message or 'internal error'} (request id {call.request_id})"

    def close_call(self, call: Call) -> None:
        """End a call (idempotent): metrics and the access-log line."""
        if call.closed:
            return
        call.closed = True
        self._end(call)

    async def _fail(
        self, call: Call, exc: BaseException, context: grpc.aio.ServicerContext
    ) -> None:
        """Abort with the table's status (raises), or record how the call ended and return."""
        if isinstance(exc, grpc.aio.AbortError):
            if call.code == grpc.StatusCode.OK:
                call.code = context.code() or grpc.StatusCode.UNKNOWN
            return
        if isinstance(exc, asyncio.CancelledError | GeneratorExit):
            remaining = context.time_remaining()
            expired = remaining is not None and remaining <= 0
            call.code = grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED
            return
        if not isinstance(exc, Exception):
            call.code = grpc.StatusCode.INTERNAL
            return
        rule, message = self.describe_failure(call, exc)
        await context.abort(
            rule.code, message, trailing_metadata=(("x-request-id", call.request_id),)
        )

    def _end(self, call: Call) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._idle is not None:
            self._idle.set()
        seconds = time.perf_counter() - call.started
        code = call.code.name
        if self._metrics is not None:
            self._metrics.observe_call(call.rpc, code, seconds)
        if access_logger.isEnabledFor(logging.INFO):
            access_logger.info(
                "call",
                extra={
                    "fields": {
                        "rpc": call.rpc,
                        "code": code,
                        "ms": round(seconds * 1000, 3),
                        "request_id": call.request_id,
                        "facts": call.facts,
                        "principal": call.principal.name,
                        "door": call.door,
                    }
                },
            )


async def _checked(requests: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A request stream whose undecodable messages raise ``InvalidInput``."""
    async for msg in requests:
        yield check_decoded(msg)
