"""Item 12 over the HTTP/JSON door: the same generated isolation matrix as
``test_isolation.py`` (every RPC x foreign token / foreign ids / mixed batches / canary-aimed
calls, then again after a restart), planted and probed through ``POST /v1/<Rpc>`` on a real
uvicorn server next to gRPC. Every cell must be denied or answer with B's data only, a foreign
id must read exactly like an absent one (status, message with the id masked, header names),
and no canary byte may appear in any body, header, log line or the process's output.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the HTTP door needs the `http` extra")

from _http import HttpCaller  # noqa: E402
from _tenants import Answer, captured_logs, serve  # noqa: E402
from test_isolation import TOKENS, Tally, leaks, plant, run_matrix, snapshot  # noqa: E402


class HttpTenants:
    """``test_isolation.Tenants`` over HTTP: the matrix only calls ``call``."""

    def __init__(self, port: int) -> None:
        self.http = HttpCaller(port)

    def close(self) -> None:
        self.http.close()

    def call(self, rpc: str, request: Any, token: str | None) -> Answer:
        return self.http.call(rpc, request, token)

    def ok(self, rpc: str, request: Any, token: str | None) -> Any:
        answer = self.call(rpc, request, token)
        assert answer.code == "OK", (rpc, answer.code, answer.details)
        return answer.responses[0] if rpc != "Backfill" else answer.responses


def test_namespace_isolation_matrix_over_http(
    make_gate: Callable[..., Any], figures: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    tally = Tally(failures=[])
    with captured_logs() as logs:
        gate = make_gate("isolation-http.db")
        st = serve(gate, TOKENS, http_port=0)
        assert st.server is not None and st.server.http_port
        t = HttpTenants(st.server.http_port)
        try:
            world = plant(t)  # type: ignore[arg-type]
            run_matrix(t, world, gate, tally)  # type: ignore[arg-type]
            if snapshot(t, world) != world.a_snapshot:  # type: ignore[arg-type]
                tally.failures.append("B's calls changed A's data")
        finally:
            t.close()
            st.stop(grace=0)
        gate = make_gate("isolation-http.db")
        st = serve(gate, TOKENS, http_port=0)
        assert st.server is not None and st.server.http_port
        t = HttpTenants(st.server.http_port)
        try:
            run_matrix(t, world, gate, tally)  # type: ignore[arg-type]
            if snapshot(t, world) != world.a_snapshot:  # type: ignore[arg-type]
                tally.failures.append("B's calls changed A's data (after the restart)")
        finally:
            t.close()
            st.stop(grace=0)
    out, err = capfd.readouterr()
    log_text = logs.text()
    log_leaks = leaks(log_text.encode(), world.canaries)
    std_leaks = leaks((out + err).encode(), world.canaries)
    assert '"door": "http"' in log_text, "the HTTP calls' access log was not captured"
    figures.record(
        "12 isolation matrix (HTTP)",
        cells=tally.cells,
        denied=tally.denied,
        isolated_ok=tally.isolated,
        foreign_ids_like_absent=tally.like_absent,
        canary_leaks=tally.canary_leaks + log_leaks + std_leaks,
        log_lines=len(logs.lines),
        canaries=len(world.canaries),
        restarts=1,
        failures=len(tally.failures),
    )
    assert not tally.failures, "\n".join(tally.failures[:40])
    assert tally.cells == tally.denied + tally.isolated and tally.cells > 100
    assert log_leaks == 0 and std_leaks == 0
