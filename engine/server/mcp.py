"""The MCP server: memgate as memory tools for agents, with the official ``mcp`` SDK (2.x).

Tools: ``remember`` (a write through the gate: the decision and why), ``recall`` (``as_of``
passed through to the request), ``history``, ``undo``, ``forget``, ``list_reviews``,
``resolve_review``. Each tool builds the ``memgate.v1`` request message and calls the same
handler as gRPC and HTTP through :class:`engine.server.door.Door` (auth, limits, admission,
batching, metrics: one path). Errors come back as MCP tool errors carrying the status code,
the message and the request id.

**The namespace is configuration, never a tool argument**: ``memgate mcp --namespace NS`` over
stdio; over streamable HTTP (``memgate serve --http-port N --mcp``), the ``x-memgate-namespace``
header or the server's ``--mcp-namespace``, checked against the bearer token's prefixes like
any other call. A prompt injection can make the model call a tool, but not name a tenant.

The ``mcp`` extra; only this module imports the SDK.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal

try:
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError(
        "the MCP server needs the `mcp` extra: pip install 'memgate[mcp]' (the official mcp SDK)"
    ) from exc

from engine.errors import InvalidInput
from engine.server.door import CallFailed, Door
from engine.server.jsonmap import message_to_dict, parse_message
from engine.server.proto import pb
from engine.validation import check_namespace

__all__ = ["INSTRUCTIONS", "NAMESPACE_HEADER", "build_server", "http_app", "run_stdio"]

NAMESPACE_HEADER = "x-memgate-namespace"

INSTRUCTIONS = (
    "memgate is long-term memory with a write gate. Store atomic facts: one claim per "
    "`remember` call, as a full sentence that names its subject (\"The customer's office is in "
    'Chicago."), never a summary, a list or a transcript. The gate decides for each fact: add '
    "(new), replace (it updates a stored fact, which stays in history), skip (a duplicate) or "
    "review (a conflict it will not settle alone). Use `recall` before answering from memory."
)

REMEMBER = (
    "Store ONE atomic fact in long-term memory, through memgate's write gate. Pass a single "
    "self-contained claim per call, as a full sentence naming its subject, e.g. \"The customer's "
    'office is in Chicago." or "Alice prefers email over phone calls." Split compound '
    "statements into separate calls; do not store summaries, lists, questions or chat "
    "transcripts. The gate answers with a decision and why: add (a new memory), replace (the fact "
    "updates a stored one, which is superseded but kept in history; `undo` restores it), skip "
    "(already known) or review (a conflict queued for a human; see `list_reviews`). `kind`: "
    "semantic (a lasting fact, the default), episodic (an event) or procedural (how to do "
    "something). `key` (optional) names the attribute explicitly, e.g. 'customer.office': a "
    "new fact with the same key replaces the old one without a model."
)
RECALL = (
    "Search long-term memory for the facts most similar to `query` (a question or a "
    "phrase). Returns only memories active now, best first, with their ids and similarity. "
    "`as_of` (an RFC 3339 time, or an event sequence number) asks what memory held at that point "
    "instead, where the server supports it."
)
HISTORY = (
    "The chain of versions of one memory (by id), oldest first: what it replaced and what "
    "replaced it, with each version's status (active, superseded, undone, forgotten)."
)
UNDO = (
    "Undo the replacement that created memory `memory_id`: the memory it replaced becomes "
    "active again and this one is marked undone. Use it when a `remember` replaced a fact "
    "wrongly."
)
FORGET = (
    "Erase memory `memory_id` (its text is deleted, the event stays in the audit log). Use it "
    "only when the user asks for a fact to be forgotten."
)
LIST_REVIEWS = (
    "Facts the gate queued for review instead of deciding (conflicts it was not sure about), "
    "oldest first, with the stored memory each one conflicts with."
)
RESOLVE_REVIEW = (
    "Settle a queued review item: accept (the queued fact replaces the stored one), keep_both "
    "(store it as a new memory) or reject (discard it). Only on the user's instruction."
)

Resolve = Callable[[Context], tuple[str, list[tuple[str, str]]]]
"""Context -> (namespace, metadata for auth): where each transport takes the namespace from."""


def _fail(failure: CallFailed) -> ToolError:
    return ToolError(f"{failure.code}: {failure.message} (request id {failure.call.request_id})")


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "..."


def _score(cand: dict[str, Any] | None) -> str:
    if not cand:
        return ""
    parts = [f"similarity {cand.get('similarity', 0.0):.2f}"]
    if cand.get("contradiction") is not None:
        parts.append(f"contradiction {cand['contradiction']:.2f}")
    return " (" + ", ".join(parts) + ")"


def explain(decision: dict[str, Any]) -> str:
    """One sentence on why the gate decided what it did (from the decision's own fields)."""
    action = decision.get("action", "")
    target = decision.get("target_id", "")
    cands = {c.get("memory_id"): c for c in decision.get("candidates", [])}
    cand = cands.get(target)
    quoted = f' "{_short(cand["text"])}"' if cand and cand.get("text") else ""
    rule = f" [rule {decision['rule']}]" if decision.get("rule") else ""
    if action == "REPLACE":
        return (
            f"replaced {target}{quoted}{_score(cand)}: the new fact updates it; the old one is "
            f"superseded and kept in history (undo {decision.get('memory_id', '')} restores it)"
            f"{rule}"
        )
    if action == "SKIP":
        return f"not stored: it says the same as {target}{quoted}{_score(cand)}{rule}"
    if action == "REVIEW":
        return (
            f"queued for review as {decision.get('review_id', '')}: it conflicts with "
            f"{target}{quoted}{_score(cand)}, and the gate will not replace it on its own; "
            f"resolve_review settles it{rule}"
        )
    nearest = max(cands.values(), key=lambda c: c.get("similarity", 0.0), default=None)
    if nearest is None:
        return f"stored as new memory {decision.get('memory_id', '')}: nothing similar was stored"
    return (
        f"stored as new memory {decision.get('memory_id', '')}: the nearest stored memory "
        f'"{_short(nearest.get("text", ""))}"{_score(nearest)} neither says the same nor '
        f"conflicts{rule}"
    )


_NOISE = ("namespace", "scores_json")


def _memory(m: dict[str, Any]) -> dict[str, Any]:
    """A memory as an agent reads it: every field but the namespace (configuration) and the
    raw score record, so fields added to the proto reach the agent with no edit."""
    return {k: v for k, v in m.items() if k not in _NOISE}


def build_server(door: Door, resolve: Resolve, *, name: str = "memgate") -> MCPServer[Any]:
    """The MCP server whose tools call ``door``; ``resolve`` gives each call its namespace."""
    server: MCPServer[Any] = MCPServer(name, instructions=INSTRUCTIONS)

    async def call(ctx: Context, rpc: str, body: dict[str, Any]) -> dict[str, Any]:
        namespace, metadata = resolve(ctx)
        method = door.methods[rpc]
        try:
            async with door.call(rpc, metadata):
                request = parse_message(
                    {"namespace": namespace} | body
                    if "namespace" in {f.name for f in method.input_type.fields}
                    else body,
                    getattr(pb, method.input_type.name),
                    "the arguments",
                )
                response = await door.unary(rpc, request)
        except CallFailed as failure:
            raise _fail(failure) from None
        out = message_to_dict(response)
        out.pop("timings", None)
        return out

    @server.tool(description=REMEMBER)
    async def remember(
        ctx: Context,
        fact: str,
        kind: Literal["semantic", "episodic", "procedural"] = "semantic",
        key: str = "",
        source: str = "",
    ) -> dict[str, Any]:
        namespace, metadata = resolve(ctx)
        body = {
            "facts": [
                {"namespace": namespace, "text": fact, "kind": kind.upper(), "key": key}
                | ({"source": source} if source else {})
            ]
        }
        try:
            async with door.call("Write", metadata):
                request = parse_message(body, pb.WriteRequest, "the arguments")
                response = await door.unary("Write", request)
        except CallFailed as failure:
            raise _fail(failure) from None
        (decision,) = message_to_dict(response)["decisions"]
        return {
            "action": decision["action"].lower(),
            "why": explain(decision),
            "memory_id": decision.get("memory_id", ""),
            "target_id": decision.get("target_id", ""),
            "review_id": decision.get("review_id", ""),
            "rule": decision.get("rule", ""),
        }

    @server.tool(description=RECALL)
    async def recall(
        ctx: Context, query: str, k: int = 5, as_of: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"query": query, "k": k}
        if as_of is not None:
            fields = {f.name for f in pb.RecallRequest.DESCRIPTOR.fields}
            if "as_of" not in fields:
                raise ToolError("INVALID_ARGUMENT: this server does not support as_of reads")
            body["as_of"] = as_of
        out = await call(ctx, "Recall", body)
        out["hits"] = [
            {"similarity": round(h.get("similarity", 0.0), 4)} | _memory(h.get("memory", {}))
            for h in out.get("hits", [])
        ]
        return out

    @server.tool(description=HISTORY)
    async def history(ctx: Context, memory_id: str) -> dict[str, Any]:
        out = await call(ctx, "History", {"memory_id": memory_id})
        out["chain"] = [_memory(m) for m in out.get("chain", [])]
        return out

    @server.tool(description=UNDO)
    async def undo(ctx: Context, memory_id: str) -> dict[str, Any]:
        out = await call(ctx, "Undo", {"memory_id": memory_id})
        return {k: _memory(v) for k, v in out.items() if isinstance(v, dict)}

    @server.tool(description=FORGET)
    async def forget(ctx: Context, memory_id: str) -> dict[str, Any]:
        return await call(ctx, "Forget", {"memory_id": memory_id})

    @server.tool(description=LIST_REVIEWS)
    async def list_reviews(ctx: Context, limit: int = 20) -> dict[str, Any]:
        return await call(ctx, "ListReview", {"limit": limit})

    @server.tool(description=RESOLVE_REVIEW)
    async def resolve_review(
        ctx: Context, review_id: str, resolution: Literal["accept", "keep_both", "reject"]
    ) -> dict[str, Any]:
        return await call(
            ctx, "ResolveReview", {"review_id": review_id, "resolution": resolution.upper()}
        )

    return server


def _fixed(namespace: str) -> Resolve:
    check_namespace(namespace)

    def resolve(ctx: Context) -> tuple[str, list[tuple[str, str]]]:
        return namespace, []

    return resolve


def _from_headers(default_namespace: str) -> Resolve:
    if default_namespace:
        check_namespace(default_namespace)

    def resolve(ctx: Context) -> tuple[str, list[tuple[str, str]]]:
        headers = ctx.headers or {}
        namespace = headers.get(NAMESPACE_HEADER) or default_namespace
        if not namespace:
            raise ToolError(
                f"INVALID_ARGUMENT: no namespace: send the {NAMESPACE_HEADER} header, or start the "
                "server with --mcp-namespace"
            )
        auth = headers.get("authorization")
        return namespace, [] if auth is None else [("authorization", auth)]

    return resolve


def http_app(
    door: Door, *, default_namespace: str = "", host: str = "127.0.0.1"
) -> tuple[Any, Callable[[], AbstractAsyncContextManager[Any]]]:
    """(ASGI app serving streamable HTTP at ``/mcp``, its lifespan) for the HTTP door."""
    server = build_server(door, _from_headers(default_namespace))
    app = server.streamable_http_app(streamable_http_path="/mcp", host=host)
    return app, lambda: server.session_manager.run()


async def run_stdio(door: Door, namespace: str) -> None:
    """Serve the tools over stdin/stdout for one namespace, until the host closes stdin."""
    if not namespace:
        raise InvalidInput("memgate mcp needs --namespace")
    await build_server(door, _fixed(namespace)).run_stdio_async()
