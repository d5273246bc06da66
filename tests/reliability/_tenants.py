"""A real memgate server for the security tests (items 12-15), and what they read back from it.

* :class:`CountingGate`: the real gate handed to the server in place of itself; it records the
  texts of every model call (``triage`` and ``recall``), so a test can tell whether a request
  reached the model. A collaborator, not a monkeypatch.
* :class:`LogCapture`: every log record of the process (the access log and python logging,
  rendered by the server's own :class:`~engine.server.logs.JsonFormatter`), for leak checks.
* :func:`ask` / :func:`ask_stream`: one raw-stub call, answered as an :class:`Answer` holding
  everything the caller can see: status, details, response bytes, initial and trailing metadata.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import grpc

from engine.server import ServerSettings, ServerThread
from engine.server.logs import JsonFormatter

__all__ = [
    "Answer",
    "CountingGate",
    "CountingModel",
    "LogCapture",
    "ask",
    "ask_stream",
    "captured_logs",
    "serve",
]

TIMEOUT = 120


class CountingGate:
    """The real gate; every model call (triage, recall) is recorded with its texts."""

    def __init__(self, gate: Any) -> None:
        self._gate = gate
        self._lock = threading.Lock()
        self.calls: list[tuple[str, list[str]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gate, name)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.calls)

    def seen(self) -> list[str]:
        with self._lock:
            return [t for _, texts in self.calls for t in texts]

    def triage(self, facts: Any, policy: Any = "strict", **kw: Any) -> Any:
        with self._lock:
            self.calls.append(("triage", [f.text for f in facts]))
        return self._gate.triage(facts, policy, **kw)

    def recall(self, namespace: str, query: str, k: int = 10) -> Any:
        with self._lock:
            self.calls.append(("recall", [query]))
        return self._gate.recall(namespace, query, k)


class CountingModel:
    """A runtime (embedder or NLI scorer) that records the inputs of every forward call: what
    the model itself saw. Hand it to the :class:`~engine.gate.gate.Gate` in place of the
    runtime."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self._lock = threading.Lock()
        self.inputs: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.inputs)

    def embed(self, texts: Any) -> Any:
        with self._lock:
            self.inputs.append(list(texts))
        return self._model.embed(texts)

    def score(self, pairs: Any) -> Any:
        with self._lock:
            self.inputs.append(list(pairs))
        return self._model.score(pairs)


class LogCapture(logging.Handler):
    """Every record, formatted as the server writes it (one JSON object per line)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []
        self._guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        line = self.format(record)
        with self._guard:
            self.lines.append(line)

    def text(self) -> str:
        with self._guard:
            return "\n".join(self.lines)


@contextmanager
def captured_logs() -> Iterator[LogCapture]:
    """Capture every logger (root and ``memgate``, which may not propagate) at DEBUG."""
    cap = LogCapture()
    loggers = [logging.getLogger(), logging.getLogger("memgate")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.addHandler(cap)
        lg.setLevel(logging.DEBUG)
    try:
        yield cap
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.removeHandler(cap)
            lg.setLevel(level)


def serve(gate: Any, tokens: dict[str, list[str]] | None = None, **settings: Any) -> ServerThread:
    """A started in-process server on 127.0.0.1, port 0 (fixed admission bound, as in
    tests/integration/test_server.py, so no test depends on the machine's speed)."""
    settings.setdefault("max_queue_delay_s", None)
    st = ServerThread(gate, ServerSettings(port=0, **settings), tokens=tokens)
    st.start()
    return st


@dataclass(frozen=True)
class Answer:
    """Everything a caller sees of one call."""

    code: str
    details: str
    payload: bytes
    """The serialized response messages, concatenated (empty on error)."""
    metadata: tuple[tuple[str, Any], ...]
    responses: tuple[Any, ...] = ()

    def blob(self) -> bytes:
        """All of it as bytes, for leak checks."""
        parts = [self.code.encode(), self.details.encode("utf-8", "surrogatepass"), self.payload]
        for key, value in self.metadata:
            parts.append(key.encode())
            parts.append(value if isinstance(value, bytes) else str(value).encode())
        return b"\n".join(parts)

    def trailing_keys(self) -> tuple[str, ...]:
        return tuple(sorted(k for k, _ in self.metadata))


def _md(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def _metadata(call: Any) -> tuple[tuple[str, Any], ...]:
    out: list[tuple[str, Any]] = []
    for getter in ("initial_metadata", "trailing_metadata"):
        fn = getattr(call, getter, None)
        if fn is not None:
            out.extend((k, v) for k, v in (fn() or ()))
    return tuple(out)


def ask(stub_: Any, rpc: str, request: Any, token: str | None = None) -> Answer:
    """One unary call through the raw stub."""
    method = getattr(stub_, rpc)
    try:
        response, call = method.with_call(request, metadata=_md(token), timeout=TIMEOUT)
    except grpc.RpcError as err:
        return Answer(err.code().name, err.details() or "", b"", _metadata(err))
    return Answer("OK", "", response.SerializeToString(), _metadata(call), (response,))


def ask_stream(stub_: Any, requests: Iterable[Any], token: str | None = None) -> Answer:
    """One Backfill stream; the answer holds every response read before the stream ended."""
    call = stub_.Backfill(iter(list(requests)), metadata=_md(token), timeout=TIMEOUT)
    got: list[Any] = []
    try:
        for response in call:
            got.append(response)
    except grpc.RpcError as err:
        payload = b"".join(r.SerializeToString() for r in got)
        return Answer(err.code().name, err.details() or "", payload, _metadata(err), tuple(got))
    payload = b"".join(r.SerializeToString() for r in got)
    return Answer("OK", "", payload, _metadata(call), tuple(got))
