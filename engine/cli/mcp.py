"""``memgate mcp``: memgate's memory tools for an MCP host (a desktop assistant, an IDE agent),
over stdio, on an engine opened in this process for one namespace.

The host starts ``memgate mcp --namespace NS`` and speaks MCP on its stdin/stdout; the
namespace is this flag, never a tool argument. To share one store between several agents, run
``memgate serve --http-port N --mcp`` instead and point the hosts at ``http://HOST:N/mcp``.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from engine.cli.common import add_engine_flags, add_policy_file_flag, engine_settings, usage_error
from engine.cli.serve import SERVE_SPIN

__all__ = ["register"]

PROG = "memgate mcp"


def register(sub: Any) -> None:
    p = sub.add_parser("mcp", help="serve the memory tools to an MCP host over stdio")
    p.add_argument(
        "--namespace",
        required=True,
        help="the one namespace every tool call reads and writes (e.g. users/alice)",
    )
    p.add_argument("--max-text-bytes", type=int, default=32768, help="longest fact or query")
    add_policy_file_flag(p)
    # The same server core as memgate serve, so its default too: one agent's lone calls ran at
    # 0.61x the p50 latency without spinning (docs/experiments/2026-12-05-spinning-default.md).
    add_engine_flags(p, spin=SERVE_SPIN)
    p.set_defaults(func=cmd_mcp)


async def _serve(gate: Any, namespace: str, max_text_bytes: int) -> None:
    from engine.server.convert import Limits
    from engine.server.mcp import run_stdio
    from engine.server.server import MemgateServer, ServerSettings

    # No listener: the engine core (batching, admission, limits) and the handlers only.
    settings = ServerSettings(port=None, limits=Limits(max_text_bytes=max_text_bytes), grace_s=5)
    server = MemgateServer(gate, settings)
    await server.start()
    try:
        await run_stdio(server.door("mcp"), namespace)
    finally:
        await server.stop()


def cmd_mcp(args: argparse.Namespace) -> int:
    from engine.app import open_engine
    from engine.errors import InvalidInput
    from engine.gate.gate import GateSettings
    from engine.tuning.policy_file import PolicyFileGate, load_policy_file
    from engine.validation import check_namespace

    try:
        check_namespace(args.namespace)
    except InvalidInput as exc:
        usage_error(PROG, f"--namespace: {exc}")
    if not 1 <= args.max_text_bytes <= 1_000_000:
        usage_error(PROG, "--max-text-bytes must be in [1, 1000000]")
    try:
        import engine.server.mcp  # noqa: F401 - fail now, naming the extra, not mid-session
    except ImportError as exc:
        usage_error(PROG, str(exc))
    policy_file = load_policy_file(args.policy_file) if args.policy_file else None
    settings = engine_settings(args, gate=GateSettings(max_text_chars=args.max_text_bytes))
    with open_engine(settings) as eng:
        gate = eng.gate if policy_file is None else PolicyFileGate(eng.gate, policy_file)
        asyncio.run(_serve(gate, args.namespace, args.max_text_bytes))
    return 0
