"""A synchronous Python client for ``memgate serve``.

::

    from engine.client import MemgateClient
    from engine.types import Fact

    with MemgateClient("127.0.0.1:50051", token="...") as mg:
        out = mg.write([Fact("acme/alice", "The customer's office is in Chicago.")])
        print(out.decisions[0].action, out.decisions[0].target_id, out.timings["total"])

Every method returns the domain types of :mod:`engine.types` (``Decision``, ``Memory``,
``ReviewItem``) and raises the :mod:`engine.errors` class the server's status maps to (the same
table, read backwards), with ``code`` (the gRPC status name) and ``request_id`` attributes.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc

from engine.errors import DeadlineExceeded, InvalidInput, MemgateError
from engine.lifecycle import Hits
from engine.server import convert
from engine.server.proto import pb, pb_grpc
from engine.server.status import error_class
from engine.types import Decision, Event, Fact, Memory, ReviewItem

__all__ = ["Hits", "MemgateClient", "Resolved", "Triaged", "as_of_text"]


def as_of_text(as_of: str | float | int | datetime | None) -> str:
    """``as_of`` on the wire: "" (now), digits (an event seq, from an int), or RFC 3339 (from
    a Unix time or an aware datetime); a string is sent as it is (the server checks it)."""
    if as_of is None:
        return ""
    if isinstance(as_of, str):
        return as_of
    if isinstance(as_of, bool):
        raise InvalidInput("as_of must be a seq, a time or a datetime, not a bool")
    if isinstance(as_of, int):
        return str(as_of)
    if isinstance(as_of, float):
        as_of = datetime.fromtimestamp(as_of, tz=UTC)
    if as_of.tzinfo is None:
        raise InvalidInput("as_of datetime must be timezone-aware")
    return as_of.isoformat()


@dataclass(frozen=True)
class Triaged:
    """The answer to a Triage or Write: one decision per fact, in order."""

    decisions: list[Decision]
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per phase (tokenize, queue, embed, search, nli, store, total) and batch_facts."""
    request_id: str = ""


@dataclass(frozen=True)
class Resolved:
    status: str
    """The review item's new status: accepted, kept_both or rejected."""
    memory_id: str | None


# Only RESOURCE_EXHAUSTED: admission refuses before any work. UNAVAILABLE is not retried by the
# channel, since a connection lost mid-Write may have committed: ``write`` retries it itself, and
# only when every fact carries an idempotency key (the retry then replays the first commit).
_RETRY_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "memgate.v1.Memgate"}],
                "retryPolicy": {
                    "maxAttempts": 4,
                    "initialBackoff": "0.05s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2.5,
                    "retryableStatusCodes": ["RESOURCE_EXHAUSTED"],
                },
            }
        ]
    }
)


def _targets(target: str | Sequence[str]) -> tuple[str, bool]:
    """The gRPC target for one server or several replicas, and whether there are several."""
    if isinstance(target, str):
        if target.startswith("ipv4:"):
            return target, "," in target
        parts = [t.strip() for t in target.split(",") if t.strip()]
    else:
        parts = [t.strip() for t in target]
    if not parts:
        raise InvalidInput("no target: give host:port, or several for replicas")
    if len(parts) == 1:
        return parts[0], False
    return "ipv4:" + ",".join(parts), True


def _with_round_robin(config: str) -> str:
    return json.dumps({**json.loads(config), "loadBalancingConfig": [{"round_robin": {}}]})


_BACKOFF_S = 0.05
"""First retry pause bound of an idempotent call (full jitter), doubled per attempt."""
_MAX_BACKOFF_S = 1.0
_RECONNECT_MIN_MS = 100
_RECONNECT_MAX_MS = 1000


def _tagged(exc: MemgateError, code: str, request_id: str) -> MemgateError:
    exc.code = code  # type: ignore[attr-defined]
    exc.request_id = request_id  # type: ignore[attr-defined]
    return exc


def _request_id(metadata: Any) -> str:
    for key, value in metadata or ():
        if key == "x-request-id":
            return value if isinstance(value, str) else value.decode()
    return ""


def _call_id(call: Any) -> str:
    """The request id the server sent: initial metadata, else trailing (an older server)."""
    for read in ("initial_metadata", "trailing_metadata"):
        rid = _request_id(getattr(call, read)()) if hasattr(call, read) else ""
        if rid:
            return rid
    return ""


def _translate(err: grpc.RpcError) -> MemgateError:
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    return _tagged(error_class(code)(details or code.name), code.name, _call_id(err))


class MemgateClient:
    """One channel to one server, or to several replicas. Thread-safe; close it (or use
    ``with``) when done.

    ``target``: ``host:port``, or several replicas as a sequence of them, a comma-separated
    list, or a gRPC ``ipv4:h1:p1,h2:p2`` target. Several replicas are balanced round-robin over
    one channel; a call answered UNAVAILABLE by one (killed, draining, its database lost) is
    retried on the next, under the rule below (only writes whose facts all carry idempotency
    keys, and only while ``write_attempts`` and the deadline last).

    ``tls``: False for plaintext, True for TLS with the system roots, or PEM bytes of the root
    certificate to trust. ``tls_server_name`` overrides the name checked against the
    certificate (a test certificate issued for ``localhost`` reached at 127.0.0.1).
    ``timeout``: the default deadline of every call, in seconds (None: no deadline).
    ``retry``: retry calls refused by admission control (RESOURCE_EXHAUSTED) up to 3 times with
    jittered exponential backoff. A refused call did no work, so even a Write is safe to retry.
    Also retry, on UNAVAILABLE (a lost connection, a draining or restarting server), every
    call that is safe to repeat: reads (Recall, Get, History, ListReview, ListEvents), Triage,
    and a :meth:`write` whose facts all carry an idempotency key (if the lost attempt
    committed, the retry replays its result, ``Decision.replayed``, and stores nothing twice).
    Retries are bounded by time, not by count: for ``retry_s`` seconds from the first attempt
    (default 30, long enough for a restart with the real models) and within the call's own
    deadline, with full-jitter exponential backoff (50 ms doubling to 1 s). Each retry waits for
    the channel to be ready (``wait_for_ready``), and the channel re-dials a lost server every
    100 ms-1 s instead of gRPC's default of up to 2 minutes, so a write goes through within
    about a second of the server answering SERVING again. A retry must be answered within that
    window too (its deadline is the window's end, or the call's when that comes first). A write
    with a fact lacking a key is never retried on UNAVAILABLE (it may have committed), nor is
    Forget, Undo or ResolveReview. ``write_attempts``: an optional cap on attempts as well
    (None: time only). ``min_attempt_s``: a retry is sent only while at least this many seconds
    of its deadline are left after its pause. With less, the call fails at once with the last
    failure (its class and status: a draining server still reads UNAVAILABLE), its message
    naming the attempts made. A shorter attempt would only expire on the way, or be refused by
    the server's deadline door as if the server were overloaded (RESOURCE_EXHAUSTED). It bounds
    retries only: the first attempt always goes out.
    ``interceptors``: ``grpc.UnaryUnaryClientInterceptor`` objects wrapped around the channel
    (tracing, fault injection in tests). ``clock`` and ``sleep``: the monotonic clock and the
    pause between retries (tests pass fakes).
    """

    def __init__(
        self,
        target: str | Sequence[str],
        token: str | None = None,
        tls: bool | bytes = False,
        *,
        tls_server_name: str | None = None,
        timeout: float | None = 30.0,
        retry: bool = True,
        retry_s: float = 30.0,
        write_attempts: int | None = None,
        min_attempt_s: float = 0.25,
        max_message_bytes: int = 16 << 20,
        interceptors: Sequence[Any] = (),
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if write_attempts is not None and not 1 <= write_attempts <= 10_000:
            raise InvalidInput(f"write_attempts must be in [1, 10000], got {write_attempts}")
        if not 0.0 <= retry_s <= 3600.0:
            raise InvalidInput(f"retry_s must be in [0, 3600] seconds, got {retry_s}")
        if not 0.0 <= min_attempt_s <= 600.0:
            raise InvalidInput(f"min_attempt_s must be in [0, 600] seconds, got {min_attempt_s}")
        options: list[tuple[str, Any]] = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # Re-dial a lost server promptly (gRPC's default backs off to 120 s).
            ("grpc.initial_reconnect_backoff_ms", _RECONNECT_MIN_MS),
            ("grpc.min_reconnect_backoff_ms", _RECONNECT_MIN_MS),
            ("grpc.max_reconnect_backoff_ms", _RECONNECT_MAX_MS),
        ]
        target, replicas = _targets(target)
        if retry:
            config = _RETRY_CONFIG if not replicas else _with_round_robin(_RETRY_CONFIG)
            options += [("grpc.enable_retries", 1), ("grpc.service_config", config)]
        elif replicas:
            options.append(("grpc.service_config", _with_round_robin("{}")))
        if tls_server_name:
            options.append(("grpc.ssl_target_name_override", tls_server_name))
        if tls is False:
            self._channel = grpc.insecure_channel(target, options=options)
        else:
            roots = tls if isinstance(tls, bytes) else None
            creds = grpc.ssl_channel_credentials(root_certificates=roots)
            self._channel = grpc.secure_channel(target, creds, options=options)
        channel = grpc.intercept_channel(self._channel, *interceptors) if interceptors else None
        self._stub = pb_grpc.MemgateStub(channel or self._channel)
        self._health_channel = channel or self._channel
        self._retry_s = retry_s if retry else 0.0
        self._max_attempts = write_attempts if retry else 1
        self._min_attempt_s = min_attempt_s
        self._clock, self._sleep = clock, sleep
        self._metadata: tuple[tuple[str, str], ...] = (
            (("authorization", f"Bearer {token}"),) if token else ()
        )
        self.timeout = timeout

    # -- plumbing ---------------------------------------------------------------------------
    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> MemgateClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self, method: Any, request: Any, timeout: float | None, idempotent: bool = False
    ) -> tuple[Any, str]:
        """One call; when ``idempotent``, UNAVAILABLE is retried (see the class) until
        ``retry_s`` after the first attempt, within the call's deadline."""
        limit = self._timeout(timeout)
        start = self._clock()
        deadline = None if limit is None else start + limit
        retry_until = start + (self._retry_s if idempotent else 0.0)
        if deadline is not None:
            retry_until = min(retry_until, deadline)
        backoff = _BACKOFF_S
        attempt = 0
        while True:
            attempt += 1
            now = self._clock()
            # A retry waits for the channel (wait_for_ready) at most until the retry window
            # closes; the first attempt fails fast, as gRPC calls do.
            end = deadline if attempt == 1 else retry_until
            remaining = None if end is None else end - now
            try:
                if remaining is not None and remaining <= 0:
                    raise _tagged(
                        DeadlineExceeded("the deadline passed between retries"),
                        "DEADLINE_EXCEEDED",
                        "",
                    )
                response, call = method.with_call(
                    request,
                    timeout=remaining,
                    metadata=self._metadata,
                    wait_for_ready=True if attempt > 1 else None,
                )
            except grpc.RpcError as err:
                exc = _translate(err)
                if exc.code != "UNAVAILABLE" or (  # type: ignore[attr-defined]
                    self._max_attempts is not None and attempt >= self._max_attempts
                ):
                    raise exc from None
                pause = random.uniform(0, backoff)
                left = retry_until - (self._clock() + pause)
                if left <= 0:
                    raise exc from None
                if left < self._min_attempt_s:
                    raise self._out_of_time(attempt, left, exc) from None
                self._sleep(pause)
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                continue
            return response, _call_id(call)

    def _out_of_time(self, attempts: int, left: float, last: MemgateError) -> MemgateError:
        """Too little time is left for another attempt (``min_attempt_s``): the last failure,
        its class and status kept (a draining server still reads UNAVAILABLE), saying so."""
        plural = "s" if attempts > 1 else ""
        return _tagged(
            type(last)(
                f"{last} (gave up after {attempts} attempt{plural}: {left:.2f} s of the "
                f"deadline left, under the {self._min_attempt_s:g} s a retry needs, "
                "min_attempt_s)"
            ),
            getattr(last, "code", "UNKNOWN"),
            getattr(last, "request_id", ""),
        )

    def _timeout(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    @staticmethod
    def _facts(facts: Sequence[Fact]) -> list[Any]:
        return [convert.fact_to_pb(f) for f in facts]

    def _decide(
        self,
        method: Any,
        request_type: Any,
        facts: Sequence[Fact],
        policy: str,
        overrides: Mapping[str, Any] | None,
        timeout: float | None,
        idempotent: bool = False,
    ) -> Triaged:
        facts = list(facts)
        request = request_type(
            facts=self._facts(facts),
            policy=convert.policy_to_pb(policy),
            overrides=convert.overrides_to_pb(overrides),
        )
        response, rid = self._call(method, request, timeout, idempotent)
        decisions = [convert.decision_from_pb(d, facts[d.index]) for d in response.decisions]
        return Triaged(decisions, convert.timings_from_pb(response.timings), rid)

    # -- the RPCs ---------------------------------------------------------------------------
    def triage(
        self,
        facts: Sequence[Fact],
        policy: str = "strict",
        overrides: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> Triaged:
        """Decide ``facts`` without storing anything (dry run)."""
        return self._decide(
            self._stub.Triage, pb.TriageRequest, facts, policy, overrides, timeout, True
        )

    def write(
        self,
        facts: Sequence[Fact],
        policy: str = "strict",
        overrides: Mapping[str, Any] | None = None,
        *,
        timeout: float | None = None,
    ) -> Triaged:
        """Decide and commit ``facts`` in one transaction; decisions carry the stored ids.

        Retried on UNAVAILABLE when every fact carries an idempotency key (see the class)."""
        facts = list(facts)
        keyed = all(f.idempotency_key for f in facts)
        return self._decide(
            self._stub.Write, pb.WriteRequest, facts, policy, overrides, timeout, keyed
        )

    def recall(
        self,
        namespace: str,
        query: str,
        k: int = 10,
        *,
        as_of: str | float | int | datetime | None = None,
        include_inactive: bool = False,
        timeout: float | None = None,
    ) -> Hits:
        """The ``k`` memories active now (or at ``as_of``) most similar to ``query``, as
        ``(memory, similarity)`` best first. The list also carries ``.hidden`` (how many
        superseded / expired / forgotten / undone memories matched and were left out) and
        ``.seq`` (the event seq an as-of recall read at). ``as_of``: an event seq (int), a
        Unix time (float), an aware ``datetime`` or the wire string (RFC 3339 or digits)."""
        request = pb.RecallRequest(
            namespace=namespace,
            query=query.encode("utf-8"),
            k=k,
            as_of=as_of_text(as_of),
            include_inactive=include_inactive,
        )
        response, _ = self._call(self._stub.Recall, request, timeout, True)
        return Hits(
            ((convert.memory_from_pb(h.memory), float(h.similarity)) for h in response.hits),
            convert.hidden_from_pb(response.hidden),
            int(response.as_of_seq) if request.as_of else None,
        )

    def get(
        self,
        namespace: str,
        memory_id: str,
        *,
        as_of: str | float | int | datetime | None = None,
        timeout: float | None = None,
    ) -> Memory:
        """The memory now, or as it was at ``as_of`` (``NotFound`` if it did not exist yet)."""
        ref = pb.MemoryRef(namespace=namespace, memory_id=memory_id, as_of=as_of_text(as_of))
        response, _ = self._call(self._stub.Get, ref, timeout, True)
        return convert.memory_from_pb(response.memory)

    def forget(self, namespace: str, memory_id: str, *, timeout: float | None = None) -> str:
        ref = pb.MemoryRef(namespace=namespace, memory_id=memory_id)
        response, _ = self._call(self._stub.Forget, ref, timeout)
        return str(response.memory_id)

    def undo(
        self, namespace: str, memory_id: str, *, timeout: float | None = None
    ) -> tuple[Memory, Memory]:
        """Undo the replacement ``memory_id`` made: returns (restored, undone)."""
        ref = pb.MemoryRef(namespace=namespace, memory_id=memory_id)
        response, _ = self._call(self._stub.Undo, ref, timeout)
        return convert.memory_from_pb(response.restored), convert.memory_from_pb(response.undone)

    def history(
        self,
        namespace: str,
        memory_id: str,
        *,
        as_of: str | float | int | datetime | None = None,
        timeout: float | None = None,
    ) -> list[Memory]:
        """The supersedes chain holding ``memory_id``, oldest first; with ``as_of``, its
        memories that existed then, each with its status then."""
        ref = pb.MemoryRef(namespace=namespace, memory_id=memory_id, as_of=as_of_text(as_of))
        response, _ = self._call(self._stub.History, ref, timeout, True)
        return [convert.memory_from_pb(m) for m in response.chain]

    def list_review(
        self, namespace: str, limit: int = 100, *, timeout: float | None = None
    ) -> list[ReviewItem]:
        request = pb.ListReviewRequest(namespace=namespace, limit=limit)
        response, _ = self._call(self._stub.ListReview, request, timeout, True)
        return [convert.review_from_pb(r) for r in response.items]

    def resolve_review(
        self, namespace: str, review_id: str, resolution: str, *, timeout: float | None = None
    ) -> Resolved:
        """``resolution``: accept (replace the target), keep_both (add) or reject (discard)."""
        request = pb.ResolveReviewRequest(
            namespace=namespace,
            review_id=review_id,
            resolution=convert.resolution_to_pb(resolution),
        )
        response, _ = self._call(self._stub.ResolveReview, request, timeout)
        return Resolved(response.status, response.memory_id or None)

    def events(
        self,
        namespace: str,
        after_seq: int = 0,
        limit: int = 100,
        *,
        timeout: float | None = None,
    ) -> list[Event]:
        """One page of the namespace's audit log: events with ``seq > after_seq``, oldest
        first, at most ``limit`` (1-1000). Page on with ``after_seq=events[-1].seq``. Each
        event keeps its rule, scores, target and time (``Event.scores``); ``type`` is the
        store's word (``review_queued`` / ``review_resolved`` for the API's review / resolve)."""
        request = pb.ListEventsRequest(namespace=namespace, after_seq=after_seq, limit=limit)
        response, _ = self._call(self._stub.ListEvents, request, timeout, True)
        return [convert.event_from_pb(e) for e in response.events]

    def backfill(
        self,
        facts: Iterable[Fact],
        policy: str = "strict",
        *,
        dry_run: bool = False,
        overrides: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Iterator[Decision]:
        """Stream ``facts`` (any iterable, read lazily) and yield their decisions in order."""
        sent: list[Fact] = []
        policy_pb = convert.policy_to_pb(policy)
        overrides_pb = convert.overrides_to_pb(overrides)

        def requests() -> Iterator[Any]:
            for i, fact in enumerate(facts):
                sent.append(fact)
                if i == 0:
                    yield pb.BackfillRequest(
                        fact=convert.fact_to_pb(fact),
                        policy=policy_pb,
                        dry_run=dry_run,
                        overrides=overrides_pb,
                    )
                else:
                    yield pb.BackfillRequest(fact=convert.fact_to_pb(fact))

        stream = self._stub.Backfill(
            requests(), timeout=self._timeout(timeout), metadata=self._metadata
        )
        try:
            for response in stream:
                d = response.decision
                yield convert.decision_from_pb(d, sent[d.index])
        except grpc.RpcError as err:
            raise _translate(err) from None
        finally:
            stream.cancel()

    def health(self, service: str = "", *, timeout: float | None = None) -> str:
        """``SERVING`` or ``NOT_SERVING`` (``service``: "" for the server, or the service name)."""
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._health_channel)
        try:
            response = stub.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=self._timeout(timeout)
            )
        except grpc.RpcError as err:
            raise _translate(err) from None
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))
