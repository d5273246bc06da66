"""Item 13 over the HTTP/JSON door: the gRPC fuzz suite's generators and oracles, sent as JSON.

The server runs over :class:`~_tenants.CountingGate` (the real gate, counting model calls), with
HTTP next to gRPC. Requests are ``test_fuzz``'s generated messages in their JSON mapping (odd
bytes travel as lone surrogates), plus what only a JSON door meets: bodies that are not JSON,
not UTF-8, nested too deep, of the wrong shape, with unknown fields or values of the wrong type,
and odd headers (authorization, x-request-id, x-timeout-s, content-type).

Pass: no answer is INTERNAL / UNKNOWN (no HTTP 500), every error is the JSON body
``{code, message, request_id}`` with the status of the one table and a sane ``x-request-id``,
and a request refused as INVALID_ARGUMENT / UNAUTHENTICATED / PERMISSION_DENIED made no model
call. Examples are derandomized; ``MEMGATE_FUZZ_RANDOM=1`` explores new ones.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the HTTP door needs the `http` extra")

from _http import HttpCaller, request_json  # noqa: E402
from _tenants import Answer, CountingGate, CountingModel, serve  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_fuzz import (  # noqa: E402
    BAD,
    FUZZ,
    MAX_FACTS,
    REJECTED,
    TOKEN,
    TOKENS,
    batches,
    facts,
    header_values,
    ids,
    namespaces,
    overrides,
    policies,
    texts,
    valid_namespaces,
    valid_texts,
)

from engine.server.proto import pb  # noqa: E402
from engine.server.status import STATUS_TABLE  # noqa: E402

HTTP_OF = {rule.code.name: rule.http for rule in STATUS_TABLE.values()}
RID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")
RPC_NAMES = [m.name for m in pb.DESCRIPTOR.services_by_name["Memgate"].methods]


class HttpFuzz:
    def __init__(self, gate: CountingGate, runtimes: list[CountingModel], port: int) -> None:
        self.gate = gate
        self.runtimes = runtimes
        self.http = HttpCaller(port)
        self.codes: Counter[str] = Counter()
        self.statuses: Counter[int] = Counter()
        self.requests = 0

    def counts(self) -> tuple[int, int]:
        return self.gate.count, sum(r.count for r in self.runtimes)

    def send(
        self,
        rpc: str,
        body: bytes,
        token: str | None = TOKEN,
        headers: dict[str, str] | None = None,
        what: Any = None,
    ) -> Answer:
        """Send one body; check the door's contract and the fuzz oracles; return the answer."""
        before = self.counts()
        r = self.http.raw(rpc, body, token, headers)
        self.requests += 1
        self.statuses[r.status_code] += 1
        where = (rpc, r.status_code, r.text[:300], repr(what)[:300])
        assert r.status_code != 500, where
        assert RID.match(r.headers.get("x-request-id", "")), where
        answer = self.http.answer(rpc, r)
        self.codes[answer.code] += 1
        assert answer.code not in BAD, where
        if r.status_code != 200:
            assert HTTP_OF[answer.code] == r.status_code, where
        if answer.code in REJECTED and not answer.responses:
            gate_calls, model_calls = (a - b for a, b in zip(self.counts(), before, strict=True))
            assert model_calls == 0, ("a rejected request reached the model", *where)
            # Recall validates in the gate, on the model thread (see test_fuzz).
            assert gate_calls == 0 or rpc == "Recall", ("reached the model thread", *where)
        return answer

    def message(self, rpc: str, msg: Any, token: str | None = TOKEN) -> Answer:
        return self.send(rpc, json.dumps(request_json(msg)).encode("ascii"), token, what=msg)


@pytest.fixture(scope="module")
def fuzz(models: tuple[Any, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpFuzz]:
    from engine.gate.gate import Gate
    from engine.index import IndexManager
    from engine.store import SQLiteStore

    store = SQLiteStore(Path(tmp_path_factory.mktemp("fuzz-http")) / "fuzz.db")
    runtimes = [CountingModel(m) for m in models]
    index = IndexManager(store.iter_active_embeddings)
    gate = CountingGate(Gate(store, index, *runtimes))  # type: ignore[arg-type]
    server = serve(gate, TOKENS, max_request_facts=MAX_FACTS, max_queued_facts=64, http_port=0)
    assert server.server is not None and server.server.http_port
    f = HttpFuzz(gate, runtimes, server.server.http_port)
    yield f
    f.http.close()
    server.stop(grace=0)
    store.close()


# -- the gRPC suite's messages, as JSON -----------------------------------------------------------
@settings(FUZZ, max_examples=150)
@given(batch=batches(), policy=policies, ov=overrides(), write=st.booleans())
def test_http_fuzz_triage_and_write(
    fuzz: HttpFuzz, batch: list[Any], policy: int, ov: Any, write: bool
) -> None:
    cls = pb.WriteRequest if write else pb.TriageRequest
    fuzz.message("Write" if write else "Triage", cls(facts=batch, policy=policy, overrides=ov))


@settings(FUZZ, max_examples=60)
@given(stream=st.lists(facts(), min_size=0, max_size=4), policy=policies, dry=st.booleans())
def test_http_fuzz_backfill(fuzz: HttpFuzz, stream: list[Any], policy: int, dry: bool) -> None:
    requests = [
        pb.BackfillRequest(fact=f, policy=policy, dry_run=dry)
        if i == 0
        else pb.BackfillRequest(fact=f)
        for i, f in enumerate(stream)
    ]
    body = b"".join(json.dumps(request_json(m)).encode("ascii") + b"\n" for m in requests)
    before = len(fuzz.gate.seen())
    answer = fuzz.send("Backfill", body, what=requests)
    # The model saw exactly the facts the stream answered: none after a rejected one.
    assert len(fuzz.gate.seen()) - before == len(answer.responses), (answer.code, answer.details)


@settings(FUZZ, max_examples=80)
@given(
    ns=st.one_of(valid_namespaces, namespaces),
    query=st.one_of(valid_texts, texts),
    k=st.sampled_from([0, 1, 10, 1000, 1001, 2**32 - 1]),
)
def test_http_fuzz_recall(fuzz: HttpFuzz, ns: str, query: bytes, k: int) -> None:
    fuzz.message("Recall", pb.RecallRequest(namespace=ns, query=query, k=k))


@settings(FUZZ, max_examples=100)
@given(
    rpc=st.sampled_from(
        ["Get", "Forget", "Undo", "History", "ListReview", "ResolveReview", "ListEvents"]
    ),
    ns=namespaces,
    ident=ids,
    number=st.one_of(st.integers(-3, 6), st.sampled_from([1000, 1001, 2**32 - 1])),
)
def test_http_fuzz_store_rpcs(fuzz: HttpFuzz, rpc: str, ns: str, ident: str, number: int) -> None:
    if rpc == "ListReview":
        request: Any = pb.ListReviewRequest(namespace=ns, limit=max(0, number))
    elif rpc == "ResolveReview":
        resolution = min(number, 2**31 - 1)
        request = pb.ResolveReviewRequest(namespace=ns, review_id=ident, resolution=resolution)
    elif rpc == "ListEvents":
        request = pb.ListEventsRequest(namespace=ns, after_seq=max(0, number), limit=max(0, number))
    else:
        request = pb.MemoryRef(namespace=ns, memory_id=ident)
    before = fuzz.counts()
    answer = fuzz.message(rpc, request)
    assert fuzz.counts() == before  # store RPCs never reach the model
    assert answer.code in {"OK", "NOT_FOUND", "INVALID_ARGUMENT", "FAILED_PRECONDITION"}


# -- what only a JSON door meets ------------------------------------------------------------------
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)
FIELD_PATHS = [
    ("facts",),
    ("facts", 0),
    ("facts", 0, "namespace"),
    ("facts", 0, "text"),
    ("facts", 0, "kind"),
    ("facts", 0, "metadata_json"),
    ("facts", 0, "unknown"),
    ("policy",),
    ("overrides",),
    ("overrides", "top_k"),
    ("overrides", "floor"),
    ("overrides", "review_scope"),
    ("unknown",),
]


def _put(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    node: Any = body
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return body


@settings(FUZZ, max_examples=150)
@given(
    path=st.sampled_from(FIELD_PATHS),
    value=json_values,
    rpc=st.sampled_from(["Triage", "Write"]),
)
def test_http_fuzz_wrong_shapes(
    fuzz: HttpFuzz, path: tuple[Any, ...], value: Any, rpc: str
) -> None:
    body = {"facts": [{"namespace": "fz/shape", "text": "A shape test."}], "overrides": {}}
    fuzz.send(rpc, json.dumps(_put(body, path, value)).encode(), what=(path, value))


RAW_BODIES = [
    b"",
    b" ",
    b"{",
    b"}",
    b"[]",
    b"null",
    b"1",
    b'"s"',
    b"\xff\xfe{}",
    b"\xef\xbb\xbf{}",  # a UTF-8 byte-order mark
    '{"facts": []}'.encode("utf-16"),
    b'{"facts": [{"namespace": "fz/a", "text": "caf\xc3"}]}',  # truncated UTF-8
    b'{"facts": [{"namespace": "fz/a", "text": "\xed\xa0\x80"}]}',  # an encoded surrogate
    b'{"facts": [{"namespace": "fz/a", "text": "\\udc80"}]}',
    b'{"facts": [{"namespace": "fz/a\\u0000", "text": "Nul."}]}',
    b'{"facts": [{"namespace": "fz/a", "text": "x"}], "facts": []}',  # a duplicate key
    b'{"overrides": {"floor": NaN}}',
    b'{"overrides": {"floor": Infinity}}',
    b'{"overrides": {"floor": 1e999}}',
    b'{"overrides": {"top_k": 1' + b"0" * 400 + b"}}",
    b"[" * 50_000 + b"]" * 50_000,
    b'{"a":' * 20_000 + b"1" + b"}" * 20_000,
    b'{"facts": [' + b'{"namespace": "fz/a", "text": "Many."},' * 2000 + b"{}]}",
    b'{"facts": [{"namespace": "fz/a", "text": "' + b"x" * 40_000 + b'"}]}',
]


@settings(FUZZ, max_examples=80)
@given(
    rpc=st.sampled_from(RPC_NAMES),
    body=st.one_of(st.sampled_from(RAW_BODIES), st.binary(max_size=64)),
)
def test_http_fuzz_raw_bodies(fuzz: HttpFuzz, rpc: str, body: bytes) -> None:
    fuzz.send(rpc, body, what=body[:80])


@settings(FUZZ, max_examples=80)
@given(
    auth=st.one_of(st.none(), header_values),
    rid=st.one_of(
        st.none(), st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=80)
    ),
    timeout=st.one_of(
        st.none(),
        st.sampled_from(["", "0", "-1", "1e-9", "nan", "inf", "1e400", "30", "soon", "0x10"]),
    ),
    content_type=st.sampled_from(
        [
            "application/json",
            "application/json; charset=utf-8",
            "APPLICATION/JSON",
            "text/plain",
            "",
        ]
    ),
    rpc=st.sampled_from(["Get", "Recall", "Triage"]),
)
def test_http_fuzz_headers(
    fuzz: HttpFuzz,
    auth: str | None,
    rid: str | None,
    timeout: str | None,
    content_type: str,
    rpc: str,
) -> None:
    request = {
        "Get": pb.MemoryRef(namespace="fz/a", memory_id="mem_x"),
        "Recall": pb.RecallRequest(namespace="fz/a", query=b"anything at all"),
        "Triage": pb.TriageRequest(facts=[pb.Fact(namespace="fz/a", text=b"A header test.")]),
    }[rpc]
    headers = {"content-type": content_type}
    if auth is not None:
        headers["authorization"] = auth
    if rid is not None:
        headers["x-request-id"] = rid
    if timeout is not None:
        headers["x-timeout-s"] = timeout
    # A header value has no surrounding whitespace on the wire (RFC 9110 5.5; h11 refuses it).
    headers = {k: v.strip() for k, v in headers.items()}
    body = json.dumps(request_json(request)).encode()
    answer = fuzz.send(rpc, body, token=None, headers=headers, what=headers)
    if rid is not None and RID.match(rid.strip()):
        assert dict(answer.metadata)["x-request-id"] == rid.strip()


def test_http_fuzz_figures(fuzz: HttpFuzz, figures: Any) -> None:
    """Runs last in this module: the totals of every HTTP fuzz test above."""
    assert fuzz.requests > 0
    figures.record(
        "13 input fuzzing (HTTP)",
        requests=fuzz.requests,
        unknown_or_internal=fuzz.codes["UNKNOWN"] + fuzz.codes["INTERNAL"],
        http_500=fuzz.statuses[500],
        gate_calls=fuzz.gate.count,
        model_calls=sum(r.count for r in fuzz.runtimes),
        **{f"code_{k.lower()}": v for k, v in sorted(fuzz.codes.items())},
        **{f"status_{k}": v for k, v in sorted(fuzz.statuses.items())},
    )
    assert fuzz.codes["INTERNAL"] == 0 and fuzz.statuses[500] == 0
