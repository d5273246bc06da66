"""The HTTP/JSON door: ``memgate serve --http-port N``, next to gRPC in the same process.

Starlette routes served by uvicorn on the server's own event loop; every RPC of
``memgate.v1.Memgate`` is ``POST /v1/<Rpc>`` and calls the same handler as gRPC through
:class:`engine.server.door.Door` (so batching, admission, auth, limits, drain, metrics and the
access log are shared). Bodies are the protobuf JSON mapping (``engine.server.jsonmap``);
errors are ``{code, message, request_id}`` with the HTTP status of the one table
(``engine.server.status``) and the ``x-request-id`` header. ``Backfill`` takes NDJSON (one
``BackfillRequest`` per line) and streams NDJSON ``BackfillResponse`` lines as facts commit.
``GET /openapi.json`` is generated from the descriptors; ``GET /healthz`` never needs a token.
With ``mcp`` the MCP server (``engine.server.mcp``) is mounted at ``/mcp``.

Requests must say ``Content-Type: application/json`` (``application/x-ndjson`` for Backfill):
a browser cannot send that cross-origin without a CORS preflight, which this door never
grants, so a web page cannot drive a local server whose auth is off.

Starlette and uvicorn are the ``http`` extra; only this module imports them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

try:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.datastructures import Headers
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import BaseRoute, Mount, Route
    from starlette.types import Receive, Scope, Send
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "the HTTP/JSON door needs the `http` extra: pip install 'memgate[http]' "
        "(starlette, uvicorn)"
    ) from exc

from engine.errors import InvalidInput, Unauthenticated
from engine.server.auth import Auth
from engine.server.door import SERVICE, CallFailed, Deadline, Door, parse_timeout
from engine.server.jsonmap import encode_json, message_from_json, message_to_dict
from engine.server.openapi import NDJSON, openapi, route_of
from engine.server.proto import pb
from engine.server.status import rule_for

__all__ = ["HttpDoor", "build_app"]

log = logging.getLogger("memgate.server")

JSON = "application/json"
_VERSION = "1"


def _metadata(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    auth = headers.get("authorization")
    return [] if auth is None else [("authorization", auth)]


def _json_response(body: Any, status: int, request_id: str) -> Response:
    return Response(
        encode_json(body),
        status_code=status,
        media_type=JSON,
        headers={"x-request-id": request_id},
    )


def _error_response(failure: CallFailed) -> Response:
    return _json_response(failure.body(), failure.http, failure.call.request_id)


def _check_media(request: Request, expected: str) -> None:
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != expected:
        raise InvalidInput(f"send the body as Content-Type: {expected}")


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise InvalidInput(f"the body has {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise InvalidInput(f"the body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class _Unary:
    """``POST /v1/<Rpc>`` for a unary RPC."""

    def __init__(self, door: Door, rpc: str, request_type: Any, limit: int) -> None:
        self._door = door
        self._rpc = rpc
        self._type = request_type
        self._limit = limit

    async def handle(self, request: Request) -> Response:
        headers = request.headers
        try:
            async with self._door.call(
                self._rpc, _metadata(headers), headers.get("x-request-id")
            ) as call:
                _check_media(request, JSON)
                deadline = Deadline(parse_timeout(headers.get("x-timeout-s")))
                message = message_from_json(await _read_body(request, self._limit), self._type)
                response = await self._door.unary(self._rpc, message, deadline)
                body = message_to_dict(response)
        except CallFailed as failure:
            return _error_response(failure)
        return _json_response(body, 200, call.request_id)


class _Streaming:
    """``POST /v1/<Rpc>`` for a streaming RPC (Backfill): NDJSON in, NDJSON out.

    A raw ASGI endpoint: the request body is read while responses are written (Starlette's
    ``StreamingResponse`` would race the body for ``receive`` on ASGI 2.3 servers). The first
    response is awaited before the status line goes out, so a call refused at once gets its
    own status; a failure after that ends the stream with a line ``{"error": {...}}``."""

    def __init__(self, door: Door, rpc: str, request_type: Any, limit: int) -> None:
        self._door = door
        self._rpc = rpc
        self._type = request_type
        self._limit = limit

    async def _requests(self, request: Request) -> AsyncIterator[Any]:
        buffer = b""
        line_no = 0
        async for chunk in request.stream():
            buffer += chunk
            while True:
                cut = buffer.find(b"\n")
                if cut < 0:
                    break
                line, buffer = buffer[:cut], buffer[cut + 1 :]
                line_no += 1
                if line.strip():
                    yield message_from_json(line, self._type, f"line {line_no}")
            if len(buffer) > self._limit:
                raise InvalidInput(f"line {line_no + 1} is over the limit of {self._limit} bytes")
        if buffer.strip():
            yield message_from_json(buffer, self._type, f"line {line_no + 1}")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        headers = request.headers
        try:
            try:
                _check_media(request, NDJSON)
                deadline = Deadline(parse_timeout(headers.get("x-timeout-s")))
            except InvalidInput as bad:
                # Refused before the call began: run it through the door so it is counted.
                async with self._door.call(
                    self._rpc, _metadata(headers), headers.get("x-request-id")
                ):
                    raise bad from None
            stream = await self._door.stream(
                self._rpc,
                self._requests(request),
                metadata=_metadata(headers),
                request_id=headers.get("x-request-id"),
                deadline=deadline,
            )
        except CallFailed as failure:
            await _error_response(failure)(scope, receive, send)
            return
        rid = stream.call.request_id
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", NDJSON.encode()),
                        (b"x-request-id", rid.encode()),
                    ],
                }
            )
            try:
                async for response in stream:
                    line = encode_json(message_to_dict(response)) + b"\n"
                    await send({"type": "http.response.body", "body": line, "more_body": True})
            except CallFailed as failure:
                line = encode_json({"error": failure.body()}) + b"\n"
                await send({"type": "http.response.body", "body": line, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client went away; the stream's close below records it
        finally:
            await stream.aclose()


def _authenticated(app: Any, auth: Auth) -> Any:
    """``app`` behind the bearer-token check: with auth on, a request with no known token is
    refused (the table's row for ``Unauthenticated``) before the MCP SDK sees it. Which
    namespace a token may use is checked per call, by the handlers."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and auth.enabled:
            headers = Headers(scope=scope)
            try:
                auth.authenticate([("authorization", headers.get("authorization", ""))])
            except Unauthenticated as exc:
                rule, rid = rule_for(exc), secrets.token_hex(8)
                body = {"code": rule.code.name, "message": str(exc), "request_id": rid}
                await _json_response(body, rule.http, rid)(scope, receive, send)
                return
        await app(scope, receive, send)

    return guarded


def build_app(
    door: Door,
    *,
    health: Callable[[], bool],
    max_body_bytes: int = 16 << 20,
    mcp: tuple[Any, Callable[[], AbstractAsyncContextManager[Any]]] | None = None,
    auth: Auth | None = None,
) -> Starlette:
    """The Starlette app: one route per RPC, ``/openapi.json``, ``/healthz``, and ``mcp`` =
    (ASGI app, lifespan) mounted at ``/mcp`` when given, behind ``auth``'s token check."""
    routes: list[BaseRoute] = []
    for method in SERVICE.methods:
        request_type = getattr(pb, method.input_type.name)
        if method.client_streaming or method.server_streaming:
            endpoint: Any = _Streaming(door, method.name, request_type, max_body_bytes)
        else:
            endpoint = _Unary(door, method.name, request_type, max_body_bytes).handle
        routes.append(Route(route_of(method.name), endpoint, methods=["POST"]))
    document = encode_json(
        openapi(SERVICE, version=_VERSION, mcp_path="/mcp" if mcp is not None else None)
    )

    async def openapi_json(request: Request) -> Response:
        return Response(document, media_type=JSON)

    async def healthz(request: Request) -> Response:
        serving = health()
        body = encode_json({"status": "SERVING" if serving else "NOT_SERVING"})
        return Response(body, status_code=200 if serving else 503, media_type=JSON)

    routes += [
        Route("/openapi.json", openapi_json, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ]
    lifespan = None
    if mcp is not None:
        mcp_app, mcp_lifespan = mcp
        routes.append(Mount("/", app=_authenticated(mcp_app, auth or Auth(None))))

        @asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            async with mcp_lifespan():
                yield

    return Starlette(routes=routes, lifespan=lifespan)


class HttpDoor:
    """uvicorn serving :func:`build_app` on the caller's event loop (no signal handlers: the
    process's owner, :func:`engine.server.server.serve`, handles them)."""

    def __init__(
        self,
        app: Starlette,
        *,
        host: str,
        port: int,
        tls_cert: bytes | None = None,
        tls_key: bytes | None = None,
    ) -> None:
        self._app = app
        self._host = host
        self._port = port
        self._tls = (tls_cert, tls_key) if tls_cert is not None and tls_key is not None else None
        self._server: uvicorn.Server | None = None
        self._socket: socket.socket | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self.port: int | None = None

    async def start(self) -> int:
        family = socket.AF_INET6 if ":" in self._host.strip("[]") else socket.AF_INET
        # proto=IPPROTO_TCP: asyncio sets TCP_NODELAY only on sockets that say they are TCP
        # (proto 0 would leave Nagle on, and every response would wait ~40 ms for the client's
        # delayed ACK between its head and body writes). Linux also inherits it on accept.
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((self._host.strip("[]"), self._port))
        except OSError as exc:
            sock.close()
            raise InvalidInput(
                f"could not bind {self._host}:{self._port} for HTTP: {exc}"
            ) from None
        sock.listen(2048)
        sock.setblocking(False)
        self._socket = sock
        self.port = int(sock.getsockname()[1])
        options: dict[str, Any] = {
            "log_config": None,
            "access_log": False,  # the interceptor writes one access-log line per call
            "lifespan": "on",
            "timeout_graceful_shutdown": 5,
            "server_header": False,
        }
        with tempfile.TemporaryDirectory(prefix="memgate-tls-") as tmp:
            if self._tls is not None:
                cert, key = Path(tmp) / "cert.pem", Path(tmp) / "key.pem"
                cert.write_bytes(self._tls[0])
                fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as f:
                    f.write(self._tls[1])
                options |= {"ssl_certfile": str(cert), "ssl_keyfile": str(key)}
            config = uvicorn.Config(self._app, **options)
            config.load()  # reads the TLS files now; they are removed on leaving
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])
        if server.should_exit:
            raise InvalidInput("the HTTP door could not start (see the log)")
        self._server = server
        self._loop_task = asyncio.get_running_loop().create_task(server.main_loop())
        return self.port

    async def stop(self) -> None:
        """Close the listener, let open connections finish (bounded), end the lifespan."""
        server = self._server
        if server is None:
            return
        self._server = None
        server.should_exit = True
        if self._loop_task is not None:
            await asyncio.gather(self._loop_task, return_exceptions=True)
        await server.shutdown(sockets=[self._socket] if self._socket is not None else None)
