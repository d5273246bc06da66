"""The MCP server with the official SDK's own client, over both transports:

* streamable HTTP: ``memgate serve --http-port 0 --mcp`` as an in-process
  :class:`~engine.server.ServerThread` (real gate, SQLite on tmp_path), with bearer tokens;
* stdio: ``python -m engine mcp --namespace NS`` as a subprocess, as an MCP host starts it.

Each runs remember (Denver) -> remember (Chicago: replace, and why) -> recall -> undo -> recall.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp", reason="the MCP server needs the `mcp` extra")

import httpx2  # noqa: E402
from mcp.client.session import ClientSession  # noqa: E402
from mcp.client.stdio import StdioServerParameters, stdio_client  # noqa: E402
from mcp.client.streamable_http import streamable_http_client  # noqa: E402
from test_server import ACME, TOKENS, Harness  # noqa: E402

from engine.cli.common import default_cache_dir  # noqa: E402
from engine.server import ServerThread  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DENVER = "The customer's office is in Denver."
CHICAGO = "The customer's office is in Chicago."
QUERY = "Where is the customer's office?"
TOOLS = {"remember", "recall", "history", "undo", "forget", "list_reviews", "resolve_review"}


@pytest.fixture
def h(make_gate: Callable[..., Any]) -> Iterator[Harness]:
    harness = Harness(make_gate)
    yield harness
    harness.close()


async def tool(session: ClientSession, name: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(name, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    # The text content is the same object as JSON (what a host shows the model).
    text = result.content[0].text  # type: ignore[union-attr]
    assert json.loads(text) == result.structured_content
    out: dict[str, Any] = result.structured_content
    return out


async def tool_error(session: ClientSession, name: str, **arguments: Any) -> str:
    result = await session.call_tool(name, arguments)
    assert result.is_error
    text: str = result.content[0].text  # type: ignore[union-attr]
    return text


async def story(session: ClientSession) -> None:
    """remember -> remember (replace) -> recall -> history -> undo -> recall."""
    await session.initialize()
    listed = (await session.list_tools()).tools
    assert {t.name for t in listed} == TOOLS
    by_name = {t.name: t for t in listed}
    assert "atomic fact" in (by_name["remember"].description or "")
    assert "one" in (by_name["remember"].description or "").lower()
    for t in listed:  # the namespace is configuration, never an argument the model fills
        assert "namespace" not in t.input_schema.get("properties", {}), t.name

    first = await tool(session, "remember", fact=DENVER)
    assert first["action"] == "add" and first["memory_id"] and "new memory" in first["why"]
    second = await tool(session, "remember", fact=CHICAGO)
    assert second["action"] == "replace" and second["target_id"] == first["memory_id"]
    assert "Denver" in second["why"] and "history" in second["why"]

    hits = (await tool(session, "recall", query=QUERY, k=3))["hits"]
    assert hits[0]["id"] == second["memory_id"] and hits[0]["text"] == CHICAGO
    assert first["memory_id"] not in {hit["id"] for hit in hits}
    chain = (await tool(session, "history", memory_id=second["memory_id"]))["chain"]
    assert [m["id"] for m in chain] == [first["memory_id"], second["memory_id"]]
    # as of the first write (its event seq is 1 in this fresh namespace): Denver, not Chicago
    then = (await tool(session, "recall", query=QUERY, k=3, as_of="1"))["hits"]
    assert [hit["id"] for hit in then] == [first["memory_id"]]

    undone = await tool(session, "undo", memory_id=second["memory_id"])
    assert (undone["restored"]["id"], undone["restored"]["status"]) == (
        first["memory_id"],
        "active",
    )
    assert undone["undone"]["status"] == "undone"
    hits = (await tool(session, "recall", query=QUERY, k=1))["hits"]
    assert hits[0]["text"] == DENVER

    assert await tool(session, "list_reviews") == {"items": []}
    missing = await tool_error(session, "undo", memory_id="mem_" + "0" * 24)
    assert "NOT_FOUND: " in missing and "request id" in missing


def test_streamable_http_with_tokens_and_namespaces(h: Harness) -> None:
    st: ServerThread = h.serve(tokens=TOKENS, http_port=0, mcp=True)
    assert st.server is not None
    url = f"http://127.0.0.1:{st.server.http_port}/mcp"

    async def run(headers: dict[str, str], body: Callable[[ClientSession], Any]) -> None:
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await body(session)

    acme = {"authorization": f"Bearer {ACME}", "x-memgate-namespace": "acme/mcp"}
    asyncio.run(run(acme, story))

    async def foreign(session: ClientSession) -> None:
        await session.initialize()
        text = await tool_error(session, "remember", fact="Bob likes tea.")
        assert "PERMISSION_DENIED: " in text
        assert "Bob" not in text

    # A token may only use its own prefixes, whatever namespace the session asks for.
    asyncio.run(run(acme | {"x-memgate-namespace": "globex/mcp"}, foreign))

    async def no_namespace(session: ClientSession) -> None:
        await session.initialize()
        assert "x-memgate-namespace" in await tool_error(session, "recall", query=QUERY)

    asyncio.run(run({"authorization": f"Bearer {ACME}"}, no_namespace))

    # No token: the HTTP request itself is refused, with the table's status.
    r = httpx2.post(url, json={}, headers={"accept": "application/json, text/event-stream"})
    assert r.status_code == 401 and r.json()["code"] == "UNAUTHENTICATED"

    # The memories are plain memgate memories: the gRPC door sees them in acme/mcp.
    c = h.client(st, token=ACME)
    assert c.recall("acme/mcp", QUERY, 1)[0][0].text == DENVER


def test_stdio_subprocess_as_an_mcp_host_starts_it(tmp_path: Path) -> None:
    cache = default_cache_dir()
    if not (cache / "models" / "minilm").is_dir():
        pytest.fail(f"no model artefacts in {cache}: run `make models` (or set MEMGATE_HOME)")
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "engine",
            "mcp",
            "--namespace",
            "users/alice",
            "--data-dir",
            str(tmp_path / "data"),
            "--cache-dir",
            str(cache),
        ],
        cwd=str(ROOT),
    )

    async def run() -> None:
        with (tmp_path / "stderr.log").open("w") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write, read_timeout_seconds=120) as session,
            ):
                await story(session)

    asyncio.run(run())
    assert (tmp_path / "data" / "memgate.db").is_file()  # the store the flag named
