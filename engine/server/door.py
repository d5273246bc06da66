"""Calls into the ``memgate.v1.Memgate`` handlers for doors that are not gRPC (HTTP/JSON, MCP).

A door decodes its own wire format into the request *message*, then calls the very handler the
gRPC server calls, through the interceptor's steps (``open_call`` -> ``admit`` -> handler ->
``describe_failure`` -> ``close_call``): one request id rule, one auth, one drain, one status
table, one set of metrics and access-log lines, one engine (batching, admission, limits). A
failure comes out as :class:`CallFailed`, which carries the table's row and the message the
client may read.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

from engine.errors import InvalidInput
from engine.server.interceptor import Call, ServiceInterceptor
from engine.server.proto import pb
from engine.server.status import Rule

__all__ = ["CallFailed", "Deadline", "Door", "Stream"]

SERVICE = pb.DESCRIPTOR.services_by_name["Memgate"]


class CallFailed(Exception):
    """A call ended with a status other than OK (``rule``), with its public ``message``."""

    def __init__(self, call: Call, rule: Rule, message: str) -> None:
        super().__init__(message)
        self.call = call
        self.rule = rule
        self.message = message

    @property
    def code(self) -> str:
        return str(self.rule.code.name)

    @property
    def http(self) -> int:
        return self.rule.http

    def body(self) -> dict[str, str]:
        """The JSON error body: ``{code, message, request_id}``."""
        return {"code": self.code, "message": self.message, "request_id": self.call.request_id}


class Deadline:
    """What the handlers read of a gRPC context: ``time_remaining()`` (None: no deadline)."""

    def __init__(self, timeout_s: float | None = None) -> None:
        self._end = None if timeout_s is None else time.monotonic() + timeout_s

    def time_remaining(self) -> float | None:
        return None if self._end is None else self._end - time.monotonic()


def parse_timeout(value: str | None) -> float | None:
    """An ``x-timeout-s`` header: seconds, > 0 and finite."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        raise InvalidInput("x-timeout-s must be a number of seconds") from None
    if not 0.0 < seconds <= 86400.0:
        raise InvalidInput("x-timeout-s must be in (0, 86400] seconds")
    return seconds


_END: Any = object()


class Stream:
    """The responses of a streaming call after its first one came (or it ended at once).

    Iterate it; :meth:`aclose` it in a ``finally`` whether or not it was iterated: that ends the
    handler and closes the call (metrics, access log). A failure after the first response is
    raised from the iteration as :class:`CallFailed`."""

    def __init__(self, door: Door, call: Call, first: Any, rest: AsyncIterator[Any]) -> None:
        self.call = call
        self._door = door
        self._first = first
        self._rest = rest

    async def __aiter__(self) -> AsyncIterator[Any]:
        try:
            if self._first is _END:
                return
            first, self._first = self._first, _END
            yield first
            async for response in self._rest:
                yield response
        except Exception as exc:
            raise self._door.failed(self.call, exc) from None
        except BaseException as exc:
            self._door.interceptor.describe_failure(self.call, exc)
            raise

    async def aclose(self) -> None:
        try:
            aclose = getattr(self._rest, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            self._door.interceptor.close_call(self.call)


class Door:
    """Runs handlers of ``service`` for the door called ``name`` (``http``, ``mcp``)."""

    def __init__(self, service: Any, interceptor: ServiceInterceptor, name: str) -> None:
        self.service = service
        self.interceptor = interceptor
        self.name = name
        self.methods = {m.name: m for m in SERVICE.methods}

    def failed(self, call: Call, exc: BaseException) -> CallFailed:
        rule, message = self.interceptor.describe_failure(call, exc)
        return CallFailed(call, rule, message)

    @asynccontextmanager
    async def call(
        self,
        rpc: str,
        metadata: Iterable[tuple[str, str]] = (),
        request_id: str | None = None,
    ) -> AsyncIterator[Call]:
        """One call: opened, refused while draining, authenticated from ``metadata`` (an
        ``authorization`` pair), and closed on exit; any exception inside (the door's own
        decoding included) leaves as :class:`CallFailed`."""
        call = self.interceptor.open_call(rpc, request_id, door=self.name)
        try:
            self.interceptor.admit(call, metadata)
            yield call
        except CallFailed:
            raise
        except Exception as exc:
            raise self.failed(call, exc) from None
        except BaseException as exc:
            self.interceptor.describe_failure(call, exc)
            raise
        finally:
            self.interceptor.close_call(call)

    async def unary(self, rpc: str, request: Any, deadline: Deadline | None = None) -> Any:
        """Await the handler of a unary RPC, inside :meth:`call`."""
        return await getattr(self.service, rpc)(request, deadline or Deadline())

    async def stream(
        self,
        rpc: str,
        requests: AsyncIterable[Any],
        *,
        metadata: Iterable[tuple[str, str]] = (),
        request_id: str | None = None,
        deadline: Deadline | None = None,
    ) -> Stream:
        """Start a streaming RPC and wait for its first response, so that a call refused at
        once (auth, a bad first message, overload) fails here, before anything was sent."""
        call = self.interceptor.open_call(rpc, request_id, door=self.name)
        try:
            self.interceptor.admit(call, metadata)
            responses = aiter(getattr(self.service, rpc)(requests, deadline or Deadline()))
            first = await anext(responses, _END)
        except Exception as exc:
            failure = self.failed(call, exc)
            self.interceptor.close_call(call)
            raise failure from None
        except BaseException as exc:
            self.interceptor.describe_failure(call, exc)
            self.interceptor.close_call(call)
            raise
        return Stream(self, call, first, responses)
