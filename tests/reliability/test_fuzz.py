"""Item 13: input fuzzing over gRPC (hypothesis), with the raw stubs.

Every RPC gets generated requests: empty, huge, invalid UTF-8, control characters, NUL,
encoded surrogates and overlong forms, huge batches, odd ``metadata_json`` (deep, huge, not an
object, NaN), odd namespaces, ids, ``k`` and ``limit`` values, policies, overrides, kinds and
resolutions, odd gRPC metadata (authorization, request ids), and bytes that are no message at all.

Pass: no answer is UNKNOWN or INTERNAL, and the model never sees a rejected request: the server
runs over :class:`~_tenants.CountingGate` (the real gate, recording every model call), and an
INVALID_ARGUMENT / UNAUTHENTICATED / PERMISSION_DENIED answer must have added no model call; a
Backfill stream cut by a bad fact made exactly one model fact per decision it answered.

Examples are derandomized (the same inputs every run, so CI is deterministic); set
``MEMGATE_FUZZ_RANDOM=1`` to explore new ones.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.server.codegen import ensure

ensure()

import grpc  # noqa: E402
from _tenants import Answer, CountingGate, CountingModel, ask, ask_stream, serve  # noqa: E402

from engine.server.proto import pb, pb_grpc  # noqa: E402

TOKEN = "tok-fuzz-0123456789abcdef"
TOKENS = {TOKEN: [""], "tok-fuzz-narrow-0123456789": ["fz/narrow/"]}
BAD = frozenset({"UNKNOWN", "INTERNAL"})
REJECTED = frozenset({"INVALID_ARGUMENT", "UNAUTHENTICATED", "PERMISSION_DENIED"})
MAX_FACTS = 16

FUZZ = settings(
    deadline=None,
    derandomize=os.environ.get("MEMGATE_FUZZ_RANDOM") != "1",
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Fuzz:
    """The server, a stub, and what every answer was."""

    def __init__(self, gate: CountingGate, runtimes: list[CountingModel], target: str) -> None:
        self.gate = gate
        self.runtimes = runtimes
        self.channel = grpc.insecure_channel(
            target, options=[("grpc.max_send_message_length", 64 << 20)]
        )
        self.stub = pb_grpc.MemgateStub(self.channel)
        self.raw_target = target
        self.codes: Counter[str] = Counter()
        self.requests = 0
        self.rejected_with_model_calls: list[str] = []
        self.rejected_in_gate: Counter[str] = Counter()
        self.undecodable: Counter[str] = Counter()
        """Answers to bytes that are no message (counted apart from the fuzzed fields)."""

    def counts(self) -> tuple[int, int]:
        """(calls into the gate's model thread, forward calls of the runtimes)."""
        return self.gate.count, sum(r.count for r in self.runtimes)

    def problem(self, rpc: str, answer: Answer, before: tuple[int, int]) -> str | None:
        """What is wrong with this answer, if anything (and count it)."""
        gate_calls, model_calls = (a - b for a, b in zip(self.counts(), before, strict=True))
        self.requests += 1
        self.codes[answer.code] += 1
        if answer.code in BAD:
            return f"{rpc}: {answer.code} {answer.details!r}"
        if answer.code not in REJECTED:
            return None
        if gate_calls:
            self.rejected_in_gate[rpc] += 1
        if model_calls:
            self.rejected_with_model_calls.append(f"{rpc} {answer.code} {answer.details}")
            return f"{rpc}: {answer.code} {answer.details!r} after {model_calls} model calls"
        # Recall validates its namespace and query in the gate, on the model thread (before the
        # embedder): see test_recall_is_validated_before_the_model_thread.
        if gate_calls and rpc != "Recall":
            return f"{rpc}: {answer.code} {answer.details!r} after reaching the model thread"
        return None

    def record(self, rpc: str, answer: Answer, before: tuple[int, int], what: Any) -> None:
        problem = self.problem(rpc, answer, before)
        assert problem is None, (problem, repr(what)[:300])

    def unary(self, rpc: str, request: Any, token: str | None = TOKEN) -> Answer:
        before = self.counts()
        answer = ask(self.stub, rpc, request, token)
        self.record(rpc, answer, before, request)
        return answer


@pytest.fixture(scope="module")
def fuzz(models: tuple[Any, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzz]:
    from engine.gate.gate import Gate
    from engine.index import IndexManager
    from engine.store import SQLiteStore

    store = SQLiteStore(Path(tmp_path_factory.mktemp("fuzz")) / "fuzz.db")
    runtimes = [CountingModel(m) for m in models]
    index = IndexManager(store.iter_active_embeddings)
    gate = CountingGate(Gate(store, index, *runtimes))  # type: ignore[arg-type]
    server = serve(gate, TOKENS, max_request_facts=MAX_FACTS, max_queued_facts=64)
    f = Fuzz(gate, runtimes, server.target)
    yield f
    f.channel.close()
    server.stop(grace=0)
    store.close()


# -- strategies -----------------------------------------------------------------------------------
def _utf8(s: str) -> bytes:
    return s.encode("utf-8", "surrogatepass")


ODD_BYTES = [
    b"",
    b" ",
    b"\n\t \r",
    b"\x00",
    b"ok\x00ok",
    b"caf\xc3",  # truncated sequence
    b"\xff\xfe",
    b"\xc0\x80",  # overlong NUL
    b"\xed\xa0\x80",  # an encoded surrogate (CESU-8)
    b"\xf4\x90\x80\x80",  # beyond U+10FFFF
    b"\xe2\x80\xae reversed \xe2\x80\xac",  # RTL override (valid)
    b"zero\xe2\x80\x8bwidth",
    b"\x1b[31mred\x1b[0m",
    b"x" * 8192,
    b"x" * 8193,  # over the gate's characters limit
    "é".encode() * 8192,  # 16 KiB of bytes, 8192 characters: allowed
    b"x" * 32768,
    b"x" * 32769,  # over the byte limit
    b"y" * (1 << 20),
]
texts = st.one_of(
    st.sampled_from(ODD_BYTES),
    st.binary(max_size=48),
    st.text(max_size=48).map(_utf8),
    st.text(
        st.characters(codec="utf-8", categories=["Cc", "Cf", "Zs", "Zl", "Zp"]), max_size=24
    ).map(_utf8),
    st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=40).map(
        lambda s: _utf8("Fuzzed fact: " + s)
    ),
)
ODD_NAMESPACES = [
    "",
    "fz/a",
    "fz/narrow/x",
    "fz/../etc",
    "/abs",
    "-dash",
    ".",
    "a" * 128,
    "a" * 129,
    "fz/\u0430",  # Cyrillic a
    "fz/a b",
    "fz/a\tb",
    "fz/a\x00",
    "FZ/A",
]
namespaces = st.one_of(
    st.sampled_from(ODD_NAMESPACES),
    st.text(max_size=24),
    st.from_regex(r"\Afz/[A-Za-z0-9_.:/@-]{0,20}\Z"),
)
ODD_IDS = ["", "mem_" + "0" * 24, "rev_" + "0" * 24, "x" * 128, "x" * 129, "\x00", "mem_\u202e"]
ids = st.one_of(
    st.sampled_from(ODD_IDS),
    st.text(max_size=40),
    st.text(min_size=200, max_size=300),
)
ODD_METADATA = [
    "",
    "{}",
    "[]",
    "null",
    "1",
    '"s"',
    "{",
    '{"a": NaN}',
    '{"a": Infinity}',
    '{"a": 1e999}',
    '{"a": -1e999}',
    "[" * 20000,
    '{"a":' * 5000 + "1" + "}" * 5000,
    '{"a": [' + "[" * 30 + "]" * 30 + "]}",
    '{"a": [' + "[" * 40 + "]" * 40 + "]}",
    json.dumps({"big": "x" * 16384}),
    json.dumps({"k": "v" * 16000}),
    '{"\\ud800": "lone surrogate escape"}',
    '{"a": "\\u0000"}',
    '{"a": ' + "1" * 5000 + "}",
    '{"a": 1, "a": 2}',
]
metadata = st.one_of(
    st.sampled_from(ODD_METADATA),
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda children: (
            st.lists(children, max_size=3)
            | st.dictionaries(st.text(max_size=5), children, max_size=3)
        ),
        max_leaves=12,
    ).map(lambda v: json.dumps({"v": v})),
    st.text(max_size=30),
)
ODD_STRINGS = ["", " ", "\x00", "\u202e", "k" * 128, "k" * 129, "k" * 256, "k" * 257, "s" * 1025]
optional_text = st.one_of(
    st.sampled_from(ODD_STRINGS), st.text(max_size=40), st.text(min_size=250, max_size=300)
)
ENUM_EXTREMES = [-(2**31), 2**31 - 1]
kinds = st.one_of(st.integers(-3, 8), st.sampled_from(ENUM_EXTREMES))
policies = st.one_of(st.integers(-2, 5), st.sampled_from(ENUM_EXTREMES))


valid_namespaces = st.from_regex(r"\Afz/[a-c]{1,2}\Z")
valid_texts = st.text(st.characters(categories=["L", "N", "Zs"]), min_size=1, max_size=30).map(
    lambda s: _utf8(f"Fuzzed fact about {s}.")
)
ODD_FIELDS = {
    "namespace": namespaces,
    "text": texts,
    "kind": kinds,
    "key": optional_text,
    "metadata_json": metadata,
    "source": optional_text,
    "idempotency_key": optional_text,
}


@st.composite
def facts(draw: Any, small: bool = False) -> Any:
    """A valid fact with up to three odd fields (one at a time finds each check; several
    together find the order they are checked in). ``small``: no huge text (huge batches)."""
    fields: dict[str, Any] = {
        "namespace": draw(valid_namespaces),
        "text": draw(valid_texts),
        "kind": draw(st.integers(0, 3)),
    }
    for name in draw(st.sets(st.sampled_from(sorted(ODD_FIELDS)), max_size=3)):
        fields[name] = draw(ODD_FIELDS[name])
    if small and len(fields["text"]) > 64:
        fields["text"] = fields["text"][:64]
    return pb.Fact(**fields)


@st.composite
def overrides(draw: Any) -> Any:
    msg = pb.PolicyOverrides()
    odd_floats = st.one_of(
        st.floats(allow_nan=True, allow_infinity=True, width=32),
        st.sampled_from([0.0, 0.5, 0.95, 1.0, -0.0, 2.0]),
    )
    floats = [
        f.name
        for f in pb.PolicyOverrides.DESCRIPTOR.fields
        if f.cpp_type == f.CPPTYPE_FLOAT or f.cpp_type == f.CPPTYPE_DOUBLE
    ]
    assert floats, "PolicyOverrides has no float fields: the proto changed"
    for name in floats:
        if draw(st.integers(0, 6)) == 0:
            setattr(msg, name, draw(odd_floats))
    if draw(st.booleans()):
        msg.top_k = draw(st.sampled_from([0, 1, 20, 1000, 1001, 2**32 - 1]))
    if draw(st.integers(0, 3)) == 0:
        msg.review_scope = draw(st.sampled_from(["all", "uncertain", "", "ALL", "\x00"]))
    return msg


# Mostly a few facts; sometimes none, one over the limit, or a huge batch.
batch_sizes = st.one_of(st.integers(1, 3), st.sampled_from([0, MAX_FACTS + 1, 1000]))


@st.composite
def batches(draw: Any) -> list[Any]:
    n = draw(batch_sizes)
    if n <= 3:
        return [draw(facts()) for _ in range(n)]
    one = draw(facts(small=True))
    return [one] * n  # a huge batch: the same fact, so drawing stays cheap


# -- the tests ------------------------------------------------------------------------------------
ONE_ODD_FIELD = [
    *(("text", v) for v in ODD_BYTES),
    *(("namespace", v) for v in ODD_NAMESPACES),
    *(("metadata_json", v) for v in ODD_METADATA),
    *(("kind", v) for v in (-1, 4, *ENUM_EXTREMES)),
    *((name, v) for name in ("key", "source", "idempotency_key") for v in ODD_STRINGS),
]


def test_each_odd_value_alone(fuzz: Fuzz) -> None:
    """Every listed odd value, alone in an otherwise valid fact, through Triage, Write and
    Backfill: the table the random search below starts from."""
    problems: list[str] = []

    def check(rpc: str, request: Any) -> None:
        counts = fuzz.counts()
        if rpc == "Backfill":
            answer = ask_stream(fuzz.stub, [request], TOKEN)
        else:
            answer = ask(fuzz.stub, rpc, request, TOKEN)
        if (problem := fuzz.problem(rpc, answer, counts)) is not None:
            problems.append(f"{problem} <- {repr(request)[:120]}")

    for i, (name, value) in enumerate(ONE_ODD_FIELD):
        # A namespace of its own per value: no stored look-alikes, so few NLI pairs.
        fields: dict[str, Any] = {"namespace": f"fz/odd{i}", "text": f"Odd value {i}.".encode()}
        fields[name] = value
        f = pb.Fact(**fields)
        check("Triage", pb.TriageRequest(facts=[f]))
        check("Write", pb.WriteRequest(facts=[f]))
        check("Backfill", pb.BackfillRequest(fact=f))
    for ns in ODD_NAMESPACES:
        for ident in ODD_IDS:
            for rpc in ("Get", "Forget", "Undo", "History"):
                check(rpc, pb.MemoryRef(namespace=ns, memory_id=ident))
            check("ResolveReview", pb.ResolveReviewRequest(namespace=ns, review_id=ident))
        check("ListReview", pb.ListReviewRequest(namespace=ns))
    assert not problems, "\n".join(problems)


@settings(FUZZ, max_examples=300)
@given(batch=batches(), policy=policies, ov=overrides(), write=st.booleans())
def test_fuzz_triage_and_write(
    fuzz: Fuzz, batch: list[Any], policy: int, ov: Any, write: bool
) -> None:
    if write:
        fuzz.unary("Write", pb.WriteRequest(facts=batch, policy=policy, overrides=ov))
    else:
        fuzz.unary("Triage", pb.TriageRequest(facts=batch, policy=policy, overrides=ov))


@settings(FUZZ, max_examples=100)
@given(
    stream=st.lists(facts(), min_size=0, max_size=4),
    policy=policies,
    dry=st.booleans(),
    ov=overrides(),
)
def test_fuzz_backfill(fuzz: Fuzz, stream: list[Any], policy: int, dry: bool, ov: Any) -> None:
    requests = [
        pb.BackfillRequest(fact=f, policy=policy, dry_run=dry, overrides=ov)
        if i == 0
        else pb.BackfillRequest(fact=f)
        for i, f in enumerate(stream)
    ]
    counts = fuzz.counts()
    before = len(fuzz.gate.seen())
    answer = ask_stream(fuzz.stub, requests, TOKEN)
    seen = len(fuzz.gate.seen()) - before
    if answer.responses:  # the facts before the rejected one were served: not a rejection
        counts = fuzz.counts()
    fuzz.record("Backfill", answer, counts, requests)
    # The model saw exactly the facts the stream answered: none after (or of) a rejected one.
    assert seen == len(answer.responses), (answer.code, answer.details, seen)


@settings(FUZZ, max_examples=150)
@given(
    ns=st.one_of(valid_namespaces, namespaces),
    query=st.one_of(valid_texts, texts),
    k=st.sampled_from([0, 1, 10, 1000, 1001, 2**32 - 1]),
)
def test_fuzz_recall(fuzz: Fuzz, ns: str, query: bytes, k: int) -> None:
    fuzz.unary("Recall", pb.RecallRequest(namespace=ns, query=query, k=k))


@settings(FUZZ, max_examples=200)
@given(
    rpc=st.sampled_from(["Get", "Forget", "Undo", "History", "ListReview", "ResolveReview"]),
    ns=namespaces,
    ident=ids,
    number=st.one_of(st.integers(-3, 6), st.sampled_from([1000, 1001, 2**32 - 1])),
)
def test_fuzz_store_rpcs(fuzz: Fuzz, rpc: str, ns: str, ident: str, number: int) -> None:
    if rpc == "ListReview":
        request: Any = pb.ListReviewRequest(namespace=ns, limit=max(0, number))
    elif rpc == "ResolveReview":
        resolution = min(number, 2**31 - 1)  # an enum is an int32 on the wire
        request = pb.ResolveReviewRequest(namespace=ns, review_id=ident, resolution=resolution)
    else:
        request = pb.MemoryRef(namespace=ns, memory_id=ident)
    before = fuzz.counts()
    answer = fuzz.unary(rpc, request)
    assert fuzz.counts() == before  # store RPCs never reach the model
    assert answer.code in {
        "OK",
        "NOT_FOUND",
        "INVALID_ARGUMENT",
        "FAILED_PRECONDITION",
    }, (rpc, answer.code, answer.details)


header_values = st.one_of(
    st.sampled_from(
        [
            "",
            "Bearer",
            "Bearer ",
            f"bearer {TOKEN}",
            f"Bearer  {TOKEN}  ",
            f"Basic {TOKEN}",
            "Bearer tok-fuzz-narrow-0123456789",
            "Bearer " + "x" * 4000,
        ]
    ),
    st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=60),
)


@settings(FUZZ, max_examples=60)
@given(
    auth=st.one_of(st.none(), header_values),
    rid=st.one_of(st.none(), st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E))),
    rpc=st.sampled_from(["Get", "Recall", "Triage"]),
)
def test_fuzz_grpc_metadata(fuzz: Fuzz, auth: str | None, rid: str | None, rpc: str) -> None:
    md = []
    if auth is not None:
        md.append(("authorization", auth))
    if rid is not None:
        md.append(("x-request-id", rid))
    request = {
        "Get": pb.MemoryRef(namespace="fz/a", memory_id="mem_x"),
        "Recall": pb.RecallRequest(namespace="fz/a", query=b"anything at all"),
        "Triage": pb.TriageRequest(facts=[pb.Fact(namespace="fz/a", text=b"A header test.")]),
    }[rpc]
    before = fuzz.counts()
    try:
        _, call = getattr(fuzz.stub, rpc).with_call(request, metadata=md, timeout=60)
        answer = Answer("OK", "", b"", tuple(call.trailing_metadata() or ()))
    except grpc.RpcError as err:
        answer = Answer(
            err.code().name, err.details() or "", b"", tuple(err.trailing_metadata() or ())
        )
    fuzz.record(rpc, answer, before, md)
    rids = [v for k, v in answer.metadata if k == "x-request-id"]
    assert rids and all(len(v) <= 64 for v in rids)  # every answer carries a sane request id


RPC_NAMES = [m.name for m in pb.DESCRIPTOR.services_by_name["Memgate"].methods]


@settings(FUZZ, max_examples=60)
@given(
    rpc=st.sampled_from(RPC_NAMES),
    raw=st.one_of(
        st.binary(min_size=1, max_size=64),
        st.sampled_from(
            [
                b"\x0a\x03t/\xff\x12\x05mem_x",  # MemoryRef.namespace: bad UTF-8 in a string
                b"\x0a\x04fz/a\x12\x02\xc0\x80",  # memory_id: overlong NUL
                b"\x0a\x0d\x0a\x03t/\xff\x12\x06abcdef",  # Fact.namespace, bad UTF-8
                b"\xff\xff\xff\xff",
                b"\x0a",
            ]
        ),
    ),
)
def test_fuzz_undecodable_bytes(fuzz: Fuzz, rpc: str, raw: bytes) -> None:
    method = f"/memgate.v1.Memgate/{rpc}"
    before = fuzz.counts()
    md = (("authorization", f"Bearer {TOKEN}"),)
    try:
        if rpc == "Backfill":
            call = fuzz.channel.stream_stream(
                method, request_serializer=lambda b: b, response_deserializer=lambda b: b
            )
            list(call(iter([raw]), metadata=md, timeout=60))
        else:
            unary = fuzz.channel.unary_unary(
                method, request_serializer=lambda b: b, response_deserializer=lambda b: b
            )
            unary(raw, metadata=md, timeout=60)
        answer = Answer("OK", "", b"", ())
    except grpc.RpcError as err:
        answer = Answer(err.code().name, err.details() or "", b"", ())
    fuzz.undecodable[answer.code] += 1
    assert answer.code not in BAD, (rpc, answer.code, answer.details, raw)
    assert fuzz.counts() == before or answer.code not in REJECTED


@pytest.mark.parametrize(
    "request_",
    [
        pb.RecallRequest(namespace="", query=b"a query"),
        pb.RecallRequest(namespace="-bad", query=b"a query"),
        pb.RecallRequest(namespace="fz/a", query=b"   "),
        pb.RecallRequest(namespace="fz/a", query=b"nul\x00"),
    ],
    ids=["empty-namespace", "bad-namespace", "blank-query", "nul-query"],
)
def test_recall_is_validated_before_the_model_thread(fuzz: Fuzz, request_: Any) -> None:
    before = fuzz.gate.count
    answer = ask(fuzz.stub, "Recall", request_, TOKEN)
    assert answer.code == "INVALID_ARGUMENT"
    assert fuzz.gate.count == before


def test_fuzz_figures(fuzz: Fuzz, figures: Any) -> None:
    """Runs last in this module: the totals of every fuzz test above."""
    assert fuzz.requests > 0
    figures.record(
        "13 input fuzzing",
        requests=fuzz.requests,
        unknown_or_internal=fuzz.codes["UNKNOWN"] + fuzz.codes["INTERNAL"],
        rejected_with_model_calls=len(fuzz.rejected_with_model_calls),
        gate_calls=fuzz.gate.count,
        model_calls=sum(r.count for r in fuzz.runtimes),
        rejected_recalls_reaching_gate=fuzz.rejected_in_gate["Recall"],
        undecodable_answers=dict(fuzz.undecodable),
        **{f"code_{k.lower()}": v for k, v in sorted(fuzz.codes.items())},
    )
