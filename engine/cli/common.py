"""What every ``memgate`` command shares: the cache default, global, engine and client flags.

The only module that reads the environment for them (``MEMGATE_HOME``, ``MEMGATE_DATA``,
``MEMGATE_STORE``, ``MEMGATE_LOG``, ``MEMGATE_TOKEN``). Imports nothing heavy and no other
``engine.cli`` module, so every command module (and ``engine.cli.models``) may import it
without a cycle.

Flags that make sense on the top-level parser and on a subcommand (``--cache-dir``,
``--log-level``; ``--target``, ``--token``... on ``client`` and on each RPC) are added twice:
with their default on the outer parser, with ``argparse.SUPPRESS`` on the inner one, so that a
flag given in either position is kept and never overwritten by the inner default.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from engine.runtime.layout import HOME_ENV, default_cache_dir

__all__ = [
    "HOME_ENV",
    "add_cache_flag",
    "add_client_flags",
    "add_engine_flags",
    "add_global_flags",
    "add_policy_file_flag",
    "client_from_args",
    "default_cache_dir",
    "engine_settings",
    "facts_from_arg",
    "print_decision",
    "usage_error",
]


def _inner(inner: bool, default: Any) -> Any:
    return argparse.SUPPRESS if inner else default


def add_cache_flag(p: argparse.ArgumentParser, *, inner: bool = False) -> None:
    """``--cache-dir`` (see :func:`add_global_flags`)."""
    p.add_argument(
        "--cache-dir",
        default=_inner(inner, str(default_cache_dir())),
        help=f"model artefact cache (default: ${HOME_ENV} or ~/.cache/memgate)",
    )


def add_global_flags(p: argparse.ArgumentParser, *, inner: bool = False) -> None:
    """``--cache-dir`` and ``--log-level``: on ``memgate`` itself, and (``inner``) again on a
    command, so ``memgate serve --cache-dir D`` works as well as ``memgate --cache-dir D serve``."""
    add_cache_flag(p, inner=inner)
    p.add_argument(
        "--log-level",
        default=_inner(inner, os.environ.get("MEMGATE_LOG", "WARNING")),
        help="python logging level (default: $MEMGATE_LOG or WARNING)",
    )


def add_policy_file_flag(p: argparse.ArgumentParser) -> None:
    """``--policy-file PATH`` (written by ``memgate calibrate``), shared by every command that
    decides facts."""
    p.add_argument(
        "--policy-file",
        help="a policy file from `memgate calibrate` (base policy + validated overrides)",
    )


def add_engine_flags(
    p: argparse.ArgumentParser, *, spin: bool | None = True, spin_default: str | None = None
) -> None:
    """The flags of a command that opens the engine in process (models and store). ``spin``:
    the command's default for ONNX Runtime's spinning (``memgate serve``'s is off); None: the
    command decides later, as ``spin_default`` says."""
    add_global_flags(p, inner=True)
    p.add_argument(
        "--data-dir",
        default=os.environ.get("MEMGATE_DATA", "memgate-data"),
        help="directory of the store (default: $MEMGATE_DATA or ./memgate-data)",
    )
    p.add_argument(
        "--store",
        default=os.environ.get("MEMGATE_STORE"),
        help="a postgresql:// DSN shared by replicas (default: $MEMGATE_STORE; unset: SQLite "
        "in --data-dir)",
    )
    p.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="ONNX Runtime placement"
    )
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime threads (0 = all cores)")
    p.add_argument(
        "--spin",
        action=argparse.BooleanOptionalAction,
        default=spin,
        help="ONNX Runtime's pool threads spin between operators (--no-spin: they sleep between "
        "model calls and leave the cores to parsing and commits; default: "
        f"{spin_default or ('on' if spin else 'off')})",
    )
    p.add_argument("--nli", default="auto", help="NLI artefact name, or auto")
    p.add_argument(
        "--nli-variant", default="auto", help="NLI artefact variant (int8, fp32, ...), or auto"
    )
    p.add_argument("--embedder-variant", default="fp32", help="embedder artefact variant")
    p.add_argument(
        "--nli-sub-batch",
        default="auto",
        help="pairs per NLI forward pass, 1-4096; auto (default): measured once per machine "
        "and kept next to the NLI manifest",
    )
    p.add_argument(
        "--allow-random-weights",
        action="store_true",
        help="serve a random-initialised NLI model (speed work only)",
    )


def _sub_batch(value: str) -> int | None:
    if value == "auto":
        return None
    try:
        size = int(value)
    except ValueError:
        size = 0
    if not 1 <= size <= 4096:
        usage_error("memgate", f"--nli-sub-batch must be auto or 1-4096, got {value!r}")
    return size


def _spinning(flag: bool | None, settled: bool | None) -> bool:
    if flag is not None:
        return flag
    return settled is not False


def engine_settings(args: argparse.Namespace, *, spin: bool | None = None, **changes: Any) -> Any:
    """``EngineSettings`` from :func:`add_engine_flags`' flags (``spin``: the spinning the
    command settled on when its flag was left unset, None: spin; ``changes``: other fields)."""
    from engine.app import EngineSettings
    from engine.runtime.loader import ModelChoice
    from engine.runtime.session import SessionSettings

    return EngineSettings(
        data_dir=Path(args.data_dir),
        store_spec=getattr(args, "store", None) or None,
        cache_dir=Path(args.cache_dir).expanduser(),
        models=ModelChoice(
            embedder_variant=args.embedder_variant,
            nli=args.nli,
            nli_variant=args.nli_variant,
            allow_random_weights=args.allow_random_weights,
        ),
        session=SessionSettings(
            device=args.device,
            intra_op_threads=args.threads,
            allow_spinning=_spinning(getattr(args, "spin", None), spin),
        ),
        nli_sub_batch=_sub_batch(getattr(args, "nli_sub_batch", "auto")),
        **changes,
    )


def add_client_flags(
    p: argparse.ArgumentParser | Any,
    *,
    inner: bool = False,
    timeout: float | None = 30.0,
    target: str | None = "127.0.0.1:50051",
) -> None:
    """How to reach a running ``memgate serve``: on ``client`` and (``inner``) on each RPC.
    ``timeout`` None: no ``--timeout`` flag (a stream that lasts as long as its input);
    ``target`` None: no server unless ``--target`` is given (backfill runs in process)."""
    p.add_argument(
        "--target",
        default=_inner(inner, target),
        help=f"host:port of memgate serve (default: {target or 'none, in process'})",
    )
    p.add_argument(
        "--token",
        default=_inner(inner, os.environ.get("MEMGATE_TOKEN")),
        help="API token (default: $MEMGATE_TOKEN)",
    )
    p.add_argument(
        "--tls", action="store_true", default=_inner(inner, False), help="TLS, system roots"
    )
    p.add_argument("--tls-ca", default=_inner(inner, None), help="PEM root to trust (TLS)")
    p.add_argument(
        "--tls-server-name", default=_inner(inner, None), help="name the certificate must carry"
    )
    if timeout is not None:
        p.add_argument(
            "--timeout",
            type=float,
            default=_inner(inner, timeout),
            help=f"deadline of each call in seconds, retries included (default {timeout:g})",
        )


def client_from_args(args: argparse.Namespace, *, timeout: float | None = None) -> Any:
    """A :class:`~engine.client.MemgateClient` from :func:`add_client_flags`' flags."""
    from engine.client import MemgateClient

    tls: bool | bytes = Path(args.tls_ca).read_bytes() if args.tls_ca else bool(args.tls)
    return MemgateClient(
        args.target,
        token=args.token or None,
        tls=tls,
        tls_server_name=args.tls_server_name,
        timeout=getattr(args, "timeout", timeout),
    )


def usage_error(prog: str, message: str) -> NoReturn:
    """Exit 2 with a one-line usage error (argparse's convention), never a traceback."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def facts_from_arg(prog: str, path: str) -> Iterator[Any]:
    """The facts of a JSON Lines file argument (``-``: standard input), or a usage error when
    the argument is not a readable file (``memgate client write "some text"``)."""
    from engine.facts import read_facts

    if path != "-" and not Path(path).is_file():
        usage_error(
            prog,
            f"{path!r} is not a file: give a JSON Lines file of facts "
            '({"namespace": ..., "text": ...} per line), or - to read them from stdin',
        )
    return read_facts(path)


def print_decision(d: Any, show_candidates: int = 3) -> None:
    target = f" -> {d.target_id}" if d.target_id else ""
    print(f"[{d.action.upper():7}] {d.fact.text!r}{target}  (rule: {d.rule})")
    if d.hypothesis:
        print(f"          NLI hypothesis: {d.hypothesis!r}")
    for c in d.candidates[:show_candidates]:
        contra = "  -  " if c.contradiction is None else f"{c.contradiction:.3f}"
        print(
            f"          sim {c.similarity:.3f}  contradiction {contra}  {c.reason:<22} {c.text!r}"
        )
