"""The client's retry loop without a server: an interceptor answers every Write UNAVAILABLE
(the channel never dials), on a fake clock that each attempt and each pause moves on.

A retry is sent only with at least ``min_attempt_s`` of its deadline left; short of it the
call fails at once with its last failure (class and status kept), naming the attempts made."""

from __future__ import annotations

from typing import Any

import pytest

from engine.server.codegen import ensure

ensure()

import grpc  # noqa: E402

from engine.client import MemgateClient  # noqa: E402
from engine.errors import InvalidInput, Unavailable  # noqa: E402
from engine.types import Fact  # noqa: E402


class _Lost(grpc.RpcError):  # type: ignore[misc]
    """A call that ended UNAVAILABLE, as the channel reports a lost connection."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "injected: connection lost"

    def result(self, timeout: float | None = None) -> Any:
        raise self


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class AlwaysLost(grpc.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """Every attempt takes ``cost`` seconds of the clock and is lost; records its deadline."""

    def __init__(self, clock: Clock, cost: float) -> None:
        self.clock, self.cost = clock, cost
        self.timeouts: list[float | None] = []

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self.timeouts.append(details.timeout)
        self.clock.now += self.cost
        return _Lost()


def client(cost: float, **kw: Any) -> tuple[MemgateClient, AlwaysLost]:
    clock = Clock()
    lost = AlwaysLost(clock, cost)
    c = MemgateClient("127.0.0.1:9", interceptors=[lost], clock=clock, sleep=clock.sleep, **kw)
    return c, lost


KEYED = [Fact("ns", "The office is in Chicago.", idempotency_key="k1")]


def test_a_retry_is_not_sent_under_the_floor_and_the_error_names_the_attempts() -> None:
    # Attempts cost 0.4 s of a 1 s deadline: the second starts by 0.45 s (0.55 s left); the
    # third would start at 0.8-0.95 s with at most 0.2 s left, under the 0.25 s floor.
    c, lost = client(0.4, timeout=1.0, min_attempt_s=0.25)
    with c, pytest.raises(Unavailable) as info:
        c.write(KEYED)
    assert len(lost.timeouts) == 2
    assert all(t is not None and t >= 0.25 for t in lost.timeouts)
    message = str(info.value)
    assert "connection lost" in message and "gave up after 2 attempts" in message
    assert "min_attempt_s" in message
    assert getattr(info.value, "code", None) == "UNAVAILABLE"


def test_without_a_floor_the_short_retry_goes_out() -> None:
    # The same call with the floor at 0: a third attempt is sent with under 0.25 s left (the
    # server's deadline door would shed it as overload).
    c, lost = client(0.4, timeout=1.0, min_attempt_s=0.0)
    with c, pytest.raises(Unavailable) as info:
        c.write(KEYED)
    assert len(lost.timeouts) == 3
    last = lost.timeouts[-1]
    assert last is not None and 0 < last < 0.25
    assert "gave up" not in str(info.value)  # the deadline itself ran out


def test_the_first_attempt_goes_out_whatever_its_deadline() -> None:
    c, lost = client(0.05, timeout=0.1, min_attempt_s=0.25)
    with c, pytest.raises(Unavailable, match="gave up after 1 attempt:"):
        c.write(KEYED)
    assert lost.timeouts == [pytest.approx(0.1)]


def test_the_floor_holds_for_the_retry_window_too() -> None:
    # No call deadline: the retry window (retry_s) bounds each retry, and none is sent with
    # less than the floor left of it.
    c, lost = client(0.3, timeout=None, retry_s=2.0, min_attempt_s=0.25)
    with c, pytest.raises(Unavailable):
        c.write(KEYED)
    assert len(lost.timeouts) >= 3
    assert lost.timeouts[0] is None
    assert all(t is not None and t >= 0.25 for t in lost.timeouts[1:])


def test_a_write_without_keys_is_not_retried() -> None:
    c, lost = client(0.01, timeout=5.0)
    with c, pytest.raises(Unavailable):
        c.write([Fact("ns", "No key on this one.")])
    assert len(lost.timeouts) == 1


def test_min_attempt_s_is_range_checked() -> None:
    with pytest.raises(InvalidInput, match="min_attempt_s"):
        MemgateClient("127.0.0.1:9", min_attempt_s=-1.0)
