"""Issue 13, defects 3-9: what a Node.js client found at the gRPC edge, each pinned by a test
that failed on the main branch before the fix.

Real servers only: an in-process ``grpc.aio`` server on 127.0.0.1 port 0 over a real gate
(real models, SQLite on tmp_path), and, where a command-line flag is under test, the real
``memgate serve`` process.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from engine.server.codegen import ensure

ensure()

import grpc  # noqa: E402
from grpc_reflection.v1alpha import reflection_pb2  # noqa: E402

from engine.server import ServerSettings, ServerThread  # noqa: E402
from engine.server.metrics import Metrics  # noqa: E402
from engine.server.proto import SERVICE_NAME, pb, pb_grpc  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reliability"))
from _proc import ServerProc, free_port, start_server  # noqa: E402

TOKENS = {"tok-acme-0123456789abcdef": ["acme/"]}
ACME = "tok-acme-0123456789abcdef"


class HeldGate:
    """The real gate; clear ``hold`` to block the model thread at its next triage."""

    def __init__(self, gate: Any) -> None:
        self._gate = gate
        self.hold = threading.Event()
        self.hold.set()
        self.entered = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._gate, name)

    def triage(self, facts: Any, policy: Any = "strict", **kw: Any) -> Any:
        self.entered.set()
        assert self.hold.wait(120), "a test left the model thread held"
        return self._gate.triage(facts, policy, **kw)


@pytest.fixture
def serve(make_gate: Callable[..., Any]) -> Iterator[Callable[..., ServerThread]]:
    started: list[tuple[ServerThread, Any]] = []

    def start(
        *, tokens: dict[str, list[str]] | None = None, gate: Any = None, **settings: Any
    ) -> ServerThread:
        gate = gate if gate is not None else make_gate(f"edge-{len(started)}.db")
        st = ServerThread(
            gate, ServerSettings(port=0, max_queue_delay_s=None, **settings), tokens=tokens
        )
        st.start()
        started.append((st, gate))
        return st

    yield start
    for st, gate in started:
        if isinstance(gate, HeldGate):
            gate.hold.set()
        st.stop(grace=0)


def rpc_error(fn: Callable[[], Any]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value


# -- defect 3: one namespace rule for every RPC ---------------------------------------------------
BAD_NAMESPACES = ["nltest\n", "acme corp", "acme/" + "x" * 123 + "\n", "acme/\u00e9", "-acme", ""]


def _calls(ns: str) -> dict[str, tuple[str, Any]]:
    fact = pb.Fact(namespace=ns, text=b"The customer's office is in Denver.")
    ref = pb.MemoryRef(namespace=ns, memory_id="mem_0123")
    return {
        "Write": ("Write", pb.WriteRequest(facts=[fact])),
        "Triage": ("Triage", pb.TriageRequest(facts=[fact])),
        "Recall": ("Recall", pb.RecallRequest(namespace=ns, query=b"office")),
        "Get": ("Get", ref),
        "History": ("History", ref),
        "Forget": ("Forget", ref),
        "Undo": ("Undo", ref),
        "ListReview": ("ListReview", pb.ListReviewRequest(namespace=ns)),
        "ListEvents": ("ListEvents", pb.ListEventsRequest(namespace=ns)),
        "ResolveReview": (
            "ResolveReview",
            pb.ResolveReviewRequest(namespace=ns, review_id="rev_0123", resolution=pb.ACCEPT),
        ),
        "Backfill": ("Backfill", iter([pb.BackfillRequest(fact=fact)])),
    }


def _answer(stub: Any, method: str, request: Any, metadata: Any) -> str:
    try:
        reply = getattr(stub, method)(request, timeout=60, metadata=metadata)
        if method == "Backfill":
            list(reply)
    except grpc.RpcError as err:
        return f"{err.code().name}: {err.details()}"
    return "OK"


@pytest.mark.parametrize("auth", [False, True], ids=["auth off", "auth on"])
def test_one_namespace_rule_for_every_rpc(serve: Callable[..., ServerThread], auth: bool) -> None:
    """A namespace one RPC refuses is refused by every RPC, with INVALID_ARGUMENT, before any
    permission check (on main, ``"nltest\\n"`` was stored by Write and Get answered NOT_FOUND
    for ``"acme corp"``)."""
    st = serve(tokens=TOKENS if auth else None)
    metadata = (("authorization", f"Bearer {ACME}"),) if auth else ()
    with grpc.insecure_channel(st.target) as channel:
        stub = pb_grpc.MemgateStub(channel)
        wrong = {}
        for ns in BAD_NAMESPACES:
            for name, (method, request) in _calls(ns).items():
                answer = _answer(stub, method, request, metadata)
                if not (answer.startswith("INVALID_ARGUMENT") and "namespace" in answer):
                    wrong[(ns, name)] = answer
        assert wrong == {}
        # The longest valid namespace works end to end, so nothing it stores is unreachable.
        longest = "acme/" + "x" * 123
        write = stub.Write(
            pb.WriteRequest(facts=[pb.Fact(namespace=longest, text=b"The office is in Oslo.")]),
            timeout=60,
            metadata=metadata,
        )
        ref = pb.MemoryRef(namespace=longest, memory_id=write.decisions[0].memory_id)
        assert stub.Get(ref, timeout=60, metadata=metadata).memory.text == "The office is in Oslo."
        assert stub.Forget(ref, timeout=60, metadata=metadata).memory_id == ref.memory_id


# -- defect 4: --max-text-bytes is the one text limit ----------------------------------------------
@pytest.fixture(scope="module")
def served(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    """The real ``memgate serve`` with the flags under test (real models)."""
    metrics_port = free_port()
    proc = start_server(
        tmp_path_factory.mktemp("served"),
        cache_dir=cache_dir,
        flags=["--max-text-bytes", "32768", "--metrics-port", str(metrics_port), "--reflection"],
        timeout=180,
    )
    proc.metrics_port = metrics_port  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        proc.stop()


def test_max_text_bytes_flag_is_the_only_text_limit(served: ServerProc) -> None:
    """``memgate serve --max-text-bytes 32768`` accepts a 32,768-byte text (main refused it
    with "the limit is 8192", the gate's hidden character cap) and refuses one byte more."""
    words = ("The customer mentioned many things during the call. " * 700).encode()
    with grpc.insecure_channel(served.target) as channel:
        stub = pb_grpc.MemgateStub(channel)
        at_limit = pb.Fact(namespace="big/a", text=words[:32768])
        reply = stub.Triage(pb.TriageRequest(facts=[at_limit]), timeout=120)
        assert reply.decisions[0].action == pb.ADD
        over = pb.Fact(namespace="big/a", text=words[:32769])
        err = rpc_error(lambda: stub.Triage(pb.TriageRequest(facts=[over]), timeout=120))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "32769 bytes; the limit is 32768" in (err.details() or "")


# -- defect 5: x-request-id in the initial metadata ------------------------------------------------
def _rid(metadata: Any) -> str | None:
    return next((v for k, v in metadata or () if k == "x-request-id"), None)


def test_request_id_comes_in_initial_metadata(
    serve: Callable[..., ServerThread], make_gate: Callable[..., Any]
) -> None:
    """The proto promises ``x-request-id`` in the initial metadata: for answers, for errors,
    and on a stream before its first response (main sent it in the trailers only)."""
    gate = HeldGate(make_gate("rid.db"))
    st = serve(gate=gate)
    with grpc.insecure_channel(st.target) as channel:
        stub = pb_grpc.MemgateStub(channel)
        fact = pb.Fact(namespace="rid/a", text=b"The office is in Lisbon.")
        _, call = stub.Write.with_call(
            pb.WriteRequest(facts=[fact]), timeout=60, metadata=(("x-request-id", "abc-123"),)
        )
        assert _rid(call.initial_metadata()) == "abc-123"
        assert _rid(call.trailing_metadata()) == "abc-123"  # kept for older clients
        err = rpc_error(
            lambda: stub.Get(pb.MemoryRef(namespace="rid/a", memory_id="mem_x"), timeout=60)
        )
        assert err.code() == grpc.StatusCode.NOT_FOUND
        assert _rid(err.initial_metadata()) == _rid(err.trailing_metadata()) is not None
        # A stream: the id arrives while the model still holds the first fact.
        gate.entered.clear()
        gate.hold.clear()
        stream = stub.Backfill(iter([pb.BackfillRequest(fact=fact)]), timeout=120)
        with ThreadPoolExecutor(1) as pool:
            assert gate.entered.wait(60)
            early = pool.submit(stream.initial_metadata)
            try:
                rid = _rid(early.result(timeout=30))
            finally:
                gate.hold.set()
        assert rid is not None and len(list(stream)) == 1


# -- defect 6: reflection v1 and v1alpha -----------------------------------------------------------
def _reflect(channel: grpc.Channel, version: str, request: Any) -> Any:
    info = channel.stream_stream(
        f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    return next(iter(info(iter([request]), timeout=60)))


@pytest.mark.parametrize("version", ["v1", "v1alpha"])
def test_reflection_offers_v1_and_v1alpha(serve: Callable[..., ServerThread], version: str) -> None:
    """Both reflection protocols list and describe the services (main: v1 was UNIMPLEMENTED).
    The v1 and v1alpha messages are wire-identical, so the v1alpha classes read both."""
    from google.protobuf import descriptor_pb2

    st = serve(reflection=True)
    with grpc.insecure_channel(st.target) as channel:
        listing = _reflect(
            channel, version, reflection_pb2.ServerReflectionRequest(list_services="")
        )
        names = {s.name for s in listing.list_services_response.service}
        assert {SERVICE_NAME, "grpc.health.v1.Health"} <= names
        assert {"grpc.reflection.v1.ServerReflection"} <= names
        for symbol in (SERVICE_NAME, "grpc.reflection.v1.ServerReflection"):
            reply = _reflect(
                channel,
                version,
                reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol),
            )
            assert not reply.HasField("error_response"), (symbol, reply.error_response)
            files = [
                descriptor_pb2.FileDescriptorProto.FromString(raw)
                for raw in reply.file_descriptor_response.file_descriptor_proto
            ]
            services = {f"{f.package}.{s.name}" for f in files for s in f.service}
            assert symbol in services


# -- defect 7: process metrics, build info, dry runs apart ---------------------------------------
def test_metrics_registry_carries_process_build_and_dry_run(
    make_gate: Callable[..., Any],
) -> None:
    """The private registry carries ``process_*`` (memory, CPU, fds), ``memgate_build_info``
    names the version and the models' manifests, and Triage decisions are counted apart from
    Write's (main: none of the three)."""
    import engine

    metrics = Metrics()
    port = free_port()
    gate = make_gate("metrics.db")
    st = ServerThread(
        gate, ServerSettings(port=0, max_queue_delay_s=None, metrics_port=port), metrics=metrics
    )
    st.start()
    try:
        with grpc.insecure_channel(st.target) as channel:
            stub = pb_grpc.MemgateStub(channel)
            fact = pb.Fact(namespace="m/a", text=b"The office is in Porto.")
            other = pb.Fact(namespace="m/a", text=b"The customer plays the cello.")
            stub.Triage(pb.TriageRequest(facts=[fact, other]), timeout=60)
            stub.Write(pb.WriteRequest(facts=[fact]), timeout=60)
        sample = metrics.registry.get_sample_value
        counted = {
            (s.labels["action"], s.labels["dry_run"]): s.value
            for family in metrics.registry.collect()
            if family.name == "memgate_decisions"
            for s in family.samples
            if s.name == "memgate_decisions_total"
        }
        assert sum(v for (_, dry), v in counted.items() if dry == "true") == 2
        assert counted[("add", "false")] == 1 and sum(counted.values()) == 3
        assert (sample("process_resident_memory_bytes") or 0) > 0
        assert (sample("process_open_fds") or 0) > 0
        assert sample("process_cpu_seconds_total") is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
            body = resp.read().decode()
        info = [line for line in body.splitlines() if line.startswith("memgate_build_info{")]
        assert len(info) == 1 and info[0].endswith(" 1.0")
        e, n = gate.embedder.manifest, gate.nli.manifest
        for label in (
            f'version="{engine.__version__}"',
            f'embedder="{e.name}/{e.variant}"',
            f'nli="{n.name}/{n.variant}"',
        ):
            assert label in info[0]
        for role, m in (("embedder", e), ("nli", n)):
            seal = json.loads((m.directory / "manifest.json").read_text())["manifest_sha256"]
            assert f'{role}_manifest="{seal[:16]}"' in info[0]
        judge = getattr(gate, "judge", None)
        assert f'judge="{judge.seal[:16] if judge is not None else "none"}"' in info[0]
    finally:
        st.stop(grace=0)


# -- defect 9: command-line friction ---------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]


def _memgate(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engine", *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_cli_flags_work_in_either_position(
    serve: Callable[..., ServerThread], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``memgate client --target X write FILE`` (main: "unrecognized arguments") and
    ``memgate serve --cache-dir D`` (main: refused) parse as their other spelling does."""
    from engine.cli import build_parser, main

    parser = build_parser()
    before = parser.parse_args(["client", "--target", "h:1", "--timeout", "5", "write", "-"])
    after = parser.parse_args(["client", "write", "-", "--target", "h:1", "--timeout", "5"])
    assert (before.target, before.timeout) == (after.target, after.timeout) == ("h:1", 5.0)
    assert parser.parse_args(["client", "write", "-"]).target == "127.0.0.1:50051"
    assert parser.parse_args(["serve", "--cache-dir", "/c"]).cache_dir == "/c"
    assert parser.parse_args(["--cache-dir", "/c", "serve"]).cache_dir == "/c"
    assert parser.parse_args(["serve", "--log-level", "INFO"]).log_level == "INFO"

    st = serve()
    facts = tmp_path / "facts.jsonl"
    facts.write_text('{"namespace": "cli/a", "text": "The office is in Oslo."}\n', "utf-8")
    assert main(["client", "--target", st.target, "write", str(facts)]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[0])["action"] == "add"


def test_cli_mistakes_are_usage_errors_not_tracebacks(tmp_path: Path) -> None:
    """``memgate client write "some text"`` (main: a FileNotFoundError traceback) and other
    slips exit 2 with a one-line message."""
    cases = [
        ("client", "write", "The office is in Oslo."),
        ("client", "--target", "127.0.0.1:1", "triage", str(tmp_path / "missing.jsonl")),
        ("serve", "--max-text-bytes", "0", "--cache-dir", str(tmp_path)),
        ("serve", "--tls-cert", "c.pem", "--cache-dir", str(tmp_path)),
        ("client", "events"),
    ]
    for argv in cases:
        done = _memgate(*argv)
        assert done.returncode == 2, (argv, done.stderr)
        assert "Traceback" not in done.stderr and "error:" in done.stderr, (argv, done.stderr)


def test_cli_package_has_no_import_cycles() -> None:
    """engine/cli/ is one package, one module per command, shared flags in ``common``, and its
    module-level imports form no cycle (main: three modules importing each other lazily)."""
    import ast

    cli = ROOT / "engine" / "cli"
    modules = {p.stem: p for p in cli.glob("*.py")}
    assert {"common", "serve", "client", "backfill"} <= set(modules)
    assert not (ROOT / "engine" / "cli.py").exists()
    assert not (ROOT / "engine" / "server" / "cli.py").exists()
    assert not (ROOT / "engine" / "backfill" / "cli.py").exists()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "engine.cli":
                    deps |= {a.name for a in node.names}
                elif node.module.startswith("engine.cli."):
                    deps.add(node.module.split(".")[2])
        graph[name] = deps & set(modules)
    assert graph["common"] == set(), "common imports no command"
    assert graph["__init__"] <= {"_main"}
    state: dict[str, int] = {}

    def visit(node: str, path: tuple[str, ...]) -> None:
        if state.get(node) == 1:
            raise AssertionError(f"import cycle: {' -> '.join((*path, node))}")
        if state.get(node) == 2:
            return
        state[node] = 1
        for dep in graph[node]:
            visit(dep, (*path, node))
        state[node] = 2

    for node in graph:
        visit(node, ())
