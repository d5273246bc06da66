"""Interop: a Node.js ``@grpc/grpc-js`` client we did not write, against the real
``memgate serve --reflection`` on loopback (real models).

The client (``tests/interop/client.js``) knows nothing of ours: it discovers the service and the
health service through server reflection (protocol v1), then runs Write / Triage / Recall /
History / Undo / ListEvents, checks health, bad input and ``x-request-id``; a second run holds a
Backfill stream and a Health.Watch open while the server gets SIGTERM.

Its packages are pinned in ``package.json`` / ``package-lock.json`` and installed by
``make interop-deps`` (``npm ci``; ``.ci/run`` does it when node is present), never by the test.
Skipped, with a message, only when ``node`` is not installed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "reliability"))
from _proc import ServerProc, start_server  # noqa: E402

NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(
    NODE is None, reason="node is not installed: the Node.js interop client cannot run"
)


@pytest.fixture(scope="module")
def node() -> str:
    assert NODE is not None
    if not (HERE / "node_modules" / "@grpc" / "grpc-js").is_dir():
        pytest.fail("the interop client's packages are missing: run `make interop-deps` (npm ci)")
    return NODE


@pytest.fixture(scope="module")
def server(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    proc = start_server(
        tmp_path_factory.mktemp("interop"), cache_dir=cache_dir, flags=["--reflection"], timeout=180
    )
    try:
        yield proc
    finally:
        proc.stop()


def _lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_node_client_runs_the_story_through_reflection(node: str, server: ServerProc) -> None:
    done = subprocess.run(
        [node, "client.js", server.target, "story"],
        cwd=HERE,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    lines = _lines(done.stdout)
    failed = [line for line in lines if line.get("ok") is False or "fatal" in line]
    assert done.returncode == 0 and not failed, (failed, done.stderr[-2000:], server.tail())
    checks = [line["check"] for line in lines if "check" in line]
    assert len(checks) >= 30 and lines[-1] == {"done": True}


@pytest.fixture(scope="module")
def cut(node: str, server: ServerProc) -> dict[str, Any]:
    """A Backfill stream and a Health.Watch from the Node client; SIGTERM to the server once
    five decisions came back; what the client saw until both calls ended."""
    client = subprocess.Popen(
        [node, "client.js", server.target, "stream"],
        cwd=HERE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # a crash's stack lands in `seen` as text lines are skipped
        text=True,
    )
    seen: list[dict[str, Any]] = []
    five = threading.Event()

    def read() -> None:
        assert client.stdout is not None
        for raw in client.stdout:
            if raw.startswith("{"):
                seen.append(json.loads(raw))
                if sum("decision" in x for x in seen) >= 5:
                    five.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert five.wait(180), f"no five decisions: {seen[-5:]} {server.tail()}"
        terminated = time.monotonic()
        code = server.stop(timeout=60)
        exit_s = time.monotonic() - terminated
        client.wait(60)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait(10)
    reader.join(10)
    assert client.stdout is not None
    client.stdout.close()
    ends = {x["end"]: x for x in seen if "end" in x}
    decisions = [x["decision"] for x in seen if "decision" in x]
    return {"ends": ends, "decisions": decisions, "exit_code": code, "exit_s": exit_s}


def test_sigterm_ends_both_calls_and_the_server_exits(cut: dict[str, Any]) -> None:
    """Both calls end (the client is never left hanging), the decisions came in stream order,
    and the server exits cleanly."""
    assert set(cut["ends"]) == {"backfill", "watch"}, cut
    assert cut["decisions"] == list(range(len(cut["decisions"])))
    assert cut["exit_code"] == 0


def test_sigterm_ends_the_stream_and_watch_with_unavailable(cut: dict[str, Any]) -> None:
    """Per the issue's contract: a stream cut by SIGTERM ends with UNAVAILABLE (retryable),
    never INTERNAL or UNKNOWN, and so does Health.Watch."""
    ends = cut["ends"]
    assert ends["backfill"]["code"] == "UNAVAILABLE", ends["backfill"]
    assert ends["watch"]["code"] == "UNAVAILABLE", ends["watch"]


def test_sigterm_message_names_the_last_committed_fact(cut: dict[str, Any]) -> None:
    """The stream's UNAVAILABLE message gives the index of the last committed fact, and every
    decision up to it was delivered: a client resuming after it loses and duplicates nothing."""
    details = cut["ends"]["backfill"]["details"]
    found = re.search(r"\b(\d+)\b", details)
    assert found is not None, details
    assert int(found.group(1)) == cut["decisions"][-1], (details, cut["decisions"][-5:])
