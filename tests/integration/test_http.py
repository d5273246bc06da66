"""The HTTP/JSON door end to end: a real uvicorn server on 127.0.0.1 (port 0) next to gRPC in the
same :class:`~engine.server.ServerThread`, over a real gate, driven by httpx and by ``curl``.

The gate is wrapped by ``test_server``'s :class:`GateWrapper` (hold the model thread, make triage
raise), never monkeypatched.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the HTTP door needs the `http` extra")
pytest.importorskip("uvicorn", reason="the HTTP door needs the `http` extra")

import httpx  # noqa: E402
from test_server import ACME, GLOBEX, TOKENS, Harness  # noqa: E402

from engine.server import ServerThread  # noqa: E402
from engine.server.metrics import Metrics  # noqa: E402
from engine.server.proto import SERVICE_NAME, pb  # noqa: E402
from engine.server.status import STATUS_TABLE  # noqa: E402
from engine.types import Fact  # noqa: E402

DENVER = "The customer's office is in Denver."
CHICAGO = "The customer's office is in Chicago."
QUERY = "Where is the customer's office?"


class Http:
    """An httpx client on a server's HTTP port, with the token as a bearer header."""

    def __init__(self, st: ServerThread, token: str | None = None) -> None:
        assert st.server is not None and st.server.http_port
        self.base = f"http://127.0.0.1:{st.server.http_port}"
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(base_url=self.base, headers=headers, timeout=60)

    def post(self, rpc: str, body: Any, **headers: str) -> httpx.Response:
        return self.client.post(f"/v1/{rpc}", json=body, headers=headers)

    def ok(self, rpc: str, body: Any) -> dict[str, Any]:
        r = self.post(rpc, body)
        assert r.status_code == 200, r.text
        assert r.headers["x-request-id"]
        out: dict[str, Any] = r.json()
        return out

    def write(self, ns: str, *texts: str, **extra: Any) -> list[dict[str, Any]]:
        body = {"facts": [{"namespace": ns, "text": t} for t in texts]} | extra
        decisions: list[dict[str, Any]] = self.ok("Write", body)["decisions"]
        return decisions


def error(r: httpx.Response, status: int, code: str) -> str:
    """Assert ``r`` is the JSON error ``code`` with HTTP ``status``; return its message."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    body = r.json()
    assert set(body) == {"code", "message", "request_id"}
    assert body["code"] == code and body["request_id"] == r.headers["x-request-id"]
    assert "Traceback" not in body["message"]
    message: str = body["message"]
    return message


class HttpHarness(Harness):
    """``test_server``'s harness, which also closes the HTTP clients it made."""

    def __init__(self, make_gate: Callable[..., Any]) -> None:
        super().__init__(make_gate)
        self._http: list[Http] = []

    def http(self, st: ServerThread, token: str | None = None) -> Http:
        c = Http(st, token)
        self._http.append(c)
        return c

    def close(self) -> None:
        for c in self._http:
            c.client.close()
        super().close()


@pytest.fixture
def h(make_gate: Callable[..., Any]) -> Iterator[HttpHarness]:
    harness = HttpHarness(make_gate)
    yield harness
    harness.close()


def serve(h: HttpHarness, gate: Any = None, **settings: Any) -> ServerThread:
    return h.serve(gate, http_port=0, **settings)


# -- the story ------------------------------------------------------------------------------------
def test_denver_then_chicago_replaces_over_http(h: HttpHarness) -> None:
    st = serve(h)
    c = h.http(st)
    ns = "demo/acme"
    (d,) = c.write(ns, DENVER)
    assert d["action"] == "ADD" and d["memory_id"]
    denver = d["memory_id"]

    dry = c.ok("Triage", {"facts": [{"namespace": ns, "text": CHICAGO}]})
    assert dry["decisions"][0]["action"] == "REPLACE" and dry["decisions"][0]["memory_id"] == ""

    wrote = c.ok("Write", {"facts": [{"namespace": ns, "text": CHICAGO}]})
    (d,) = wrote["decisions"]
    assert (d["action"], d["target_id"]) == ("REPLACE", denver)
    chicago = d["memory_id"]
    assert wrote["timings"]["total"] > 0 and wrote["timings"]["batch_facts"] >= 1
    assert any(cand["memory_id"] == denver and cand["passed"] for cand in d["candidates"])

    hits = c.ok("Recall", {"namespace": ns, "query": QUERY, "k": 3})["hits"]
    assert hits[0]["memory"]["id"] == chicago and hits[0]["memory"]["text"] == CHICAGO
    assert denver not in {hit["memory"]["id"] for hit in hits}
    old = c.ok("Get", {"namespace": ns, "memory_id": denver})["memory"]
    assert (old["status"], old["superseded_by"]) == ("superseded", chicago)
    chain = c.ok("History", {"namespace": ns, "memory_id": chicago})["chain"]
    assert [m["id"] for m in chain] == [denver, chicago]
    events = c.ok("ListEvents", {"namespace": ns})
    assert [e["type"] for e in events["events"]] == ["add", "replace"]
    assert events["next_after_seq"] == events["events"][-1]["seq"]  # 64-bit: a JSON string

    # Latest-only reads say what they hid; an as-of read between the two writes sees Denver.
    now = c.ok("Recall", {"namespace": ns, "query": QUERY, "k": 3})
    assert now["hidden"]["superseded"] == 1 and now["hits"][0]["memory"]["id"] == chicago
    between = str(events["events"][0]["seq"])  # the seq of Denver's add
    then = c.ok("Recall", {"namespace": ns, "query": QUERY, "k": 3, "as_of": between})
    assert [hit["memory"]["id"] for hit in then["hits"]] == [denver]
    old_then = c.ok("Get", {"namespace": ns, "memory_id": denver, "as_of": between})["memory"]
    assert old_then["status"] == "active"

    undone = c.ok("Undo", {"namespace": ns, "memoryId": chicago})  # camelCase is read too
    assert (undone["restored"]["id"], undone["undone"]["status"]) == (denver, "undone")
    hits = c.ok("Recall", {"namespace": ns, "query": QUERY, "k": 1})["hits"]
    assert hits[0]["memory"]["id"] == denver

    # The same store over gRPC, from the same process: one engine behind both doors.
    g = h.client(st)
    assert g.get(ns, chicago).status == "undone"


def test_review_queue_and_forget_over_http(h: HttpHarness) -> None:
    c = h.http(serve(h))
    ns = "demo/review"
    (d,) = c.write(ns, DENVER)
    (q,) = c.write(ns, CHICAGO, policy="REVIEW_POLICY", overrides={"review_scope": "all"})
    assert q["action"] == "REVIEW" and q["review_id"] and q["target_id"] == d["memory_id"]
    items = c.ok("ListReview", {"namespace": ns})["items"]
    assert [(i["id"], i["text"], i["status"]) for i in items] == [
        (q["review_id"], CHICAGO, "pending")
    ]
    res = c.ok(
        "ResolveReview", {"namespace": ns, "review_id": q["review_id"], "resolution": "ACCEPT"}
    )
    assert res["status"] == "accepted" and res["memory_id"]
    again = c.post("ResolveReview", {"namespace": ns, "review_id": q["review_id"], "resolution": 3})
    error(again, 400, "FAILED_PRECONDITION")
    assert c.ok("Forget", {"namespace": ns, "memory_id": res["memory_id"]})["memory_id"]
    gone = c.post("Get", {"namespace": ns, "memory_id": "mem_" + "0" * 24})
    error(gone, 404, "NOT_FOUND")


# -- bad input ------------------------------------------------------------------------------------
def test_bad_bodies_are_400_with_a_json_error(h: HttpHarness) -> None:
    gate = h.gate()
    st = serve(h, gate)
    c = h.http(st)
    json_ct = {"content-type": "application/json"}
    post = c.client.post
    cases = {
        "not json": post("/v1/Write", content=b"{not json", headers=json_ct),
        "not utf-8": post("/v1/Write", content=b'{"facts": [{"text": "\xff"}]}', headers=json_ct),
        "unknown field": c.post("Write", {"facts": [{"namespace": "a/b", "txt": "x"}]}),
        "unknown top field": c.post("Recall", {"namespace": "a/b", "query": "x", "kk": 1}),
        "an array": c.post("Write", [1, 2]),
        "wrong type": c.post("Recall", {"namespace": "a/b", "query": "x", "k": "many"}),
        "out of range": c.post("Recall", {"namespace": "a/b", "query": "x", "k": -1}),
        "NaN literal": post("/v1/Write", content=b'{"overrides": {"floor": NaN}}', headers=json_ct),
        "lone surrogate text": post(
            "/v1/Write",
            content=b'{"facts": [{"namespace": "a/b", "text": "x\\ud800"}]}',
            headers=json_ct,
        ),
        "lone surrogate namespace": post(
            "/v1/Write",
            content=b'{"facts": [{"namespace": "a\\udc00", "text": "x"}]}',
            headers=json_ct,
        ),
        "deep nesting": post("/v1/Write", content=b"[" * 100_000 + b"]" * 100_000, headers=json_ct),
        "no facts": c.post("Write", {}),
        "empty text": c.post("Write", {"facts": [{"namespace": "a/b", "text": ""}]}),
        "bad namespace": c.post("Write", {"facts": [{"namespace": "../x", "text": "Hi."}]}),
        "unknown enum": c.post(
            "Write", {"facts": [{"namespace": "a/b", "text": "x"}], "policy": "NOPE"}
        ),
        "form content type": post(
            "/v1/Write", content=b"{}", headers={"content-type": "text/plain"}
        ),
        "bad timeout": c.post(
            "Recall", {"namespace": "a/b", "query": "x"}, **{"x-timeout-s": "soon"}
        ),
    }
    messages = {name: error(r, 400, "INVALID_ARGUMENT") for name, r in cases.items()}
    assert "UTF-8" in messages["not utf-8"] and "UTF-8" in messages["lone surrogate text"]
    assert "txt" in messages["unknown field"]
    assert "Content-Type: application/json" in messages["form content type"]
    assert gate.calls == []  # nothing invalid reached the model
    assert c.client.get("/v1/Write").status_code == 405
    assert c.client.post("/v1/NoSuchRpc", json={}).status_code == 404


def test_request_id_is_echoed_or_made(h: HttpHarness) -> None:
    c = h.http(serve(h))
    r = c.post("Recall", {"namespace": "a/b", "query": "x"}, **{"x-request-id": "req-42.a:b"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "req-42.a:b"
    r = c.post("Recall", {"namespace": "a/b", "query": ""}, **{"x-request-id": "bad id!"})
    assert error(r, 400, "INVALID_ARGUMENT") and r.headers["x-request-id"] != "bad id!"


# -- auth, isolation ------------------------------------------------------------------------------
def test_tokens_map_to_401_and_403_as_on_grpc(h: HttpHarness) -> None:
    st = serve(h, tokens=TOKENS)
    anon, stranger, acme = h.http(st), h.http(st, "not-a-known-token-at-all"), h.http(st, ACME)
    body = {"facts": [{"namespace": "acme/alice", "text": "Alice likes tea."}]}
    for c in (anon, stranger):
        error(c.post("Write", body), 401, "UNAUTHENTICATED")
    basic = anon.post("Write", body, authorization=f"Basic {ACME}")
    error(basic, 401, "UNAUTHENTICATED")
    mixed = {"facts": body["facts"] + [{"namespace": "globex/bob", "text": "Bob likes coffee."}]}
    error(acme.post("Write", mixed), 403, "PERMISSION_DENIED")
    assert acme.ok("Recall", {"namespace": "acme/alice", "query": "Alice"})["hits"] == []
    # The HTTP statuses are the table's column for the codes gRPC answers.
    by_code = {rule.code.name: rule.http for rule in STATUS_TABLE.values()}
    assert by_code["UNAUTHENTICATED"] == 401 and by_code["PERMISSION_DENIED"] == 403
    assert anon.client.get("/healthz").json() == {"status": "SERVING"}  # no token needed


def test_namespace_prefixes_isolate_tenants(h: HttpHarness) -> None:
    st = serve(h, tokens=TOKENS)
    acme, globex = h.http(st, ACME), h.http(st, GLOBEX)
    (d,) = acme.write("acme/alice", "Alice's favourite colour is green.")
    mid = d["memory_id"]
    globex.write("globex/bob", "Bob's favourite colour is blue.")
    for rpc in ("Get", "History", "Forget", "Undo"):
        error(
            globex.post(rpc, {"namespace": "acme/alice", "memory_id": mid}),
            403,
            "PERMISSION_DENIED",
        )
        error(globex.post(rpc, {"namespace": "globex/bob", "memory_id": mid}), 404, "NOT_FOUND")
    error(
        globex.post("Recall", {"namespace": "acme/alice", "query": "colour"}),
        403,
        "PERMISSION_DENIED",
    )
    error(globex.post("ListReview", {"namespace": "acme/alice"}), 403, "PERMISSION_DENIED")
    error(globex.post("ListEvents", {"namespace": "acme/alice"}), 403, "PERMISSION_DENIED")
    hits = globex.ok("Recall", {"namespace": "globex/bob", "query": "favourite colour", "k": 10})[
        "hits"
    ]
    assert mid not in {hit["memory"]["id"] for hit in hits}
    assert (
        acme.ok("Get", {"namespace": "acme/alice", "memory_id": mid})["memory"]["status"]
        == "active"
    )


# -- overload, failures, metrics ------------------------------------------------------------------
def test_overload_is_429_and_metrics_are_shared(h: HttpHarness) -> None:
    gate, metrics = h.gate(), Metrics()
    st = serve(h, gate, max_queued_facts=2, max_request_facts=2, metrics=metrics)
    c = h.http(st)
    grpc_client = h.client(st, retry=False)
    gate.hold.clear()
    with ThreadPoolExecutor(1) as pool:
        blocker = pool.submit(c.write, "load/a", "First held fact.", "Second.")
        assert gate.entered.wait(60)
        error(
            c.post("Write", {"facts": [{"namespace": "load/a", "text": "One too many."}]}),
            429,
            "RESOURCE_EXHAUSTED",
        )
        error(
            c.post("Recall", {"namespace": "load/a", "query": "anything"}),
            429,
            "RESOURCE_EXHAUSTED",
        )
        assert c.ok("ListReview", {"namespace": "load/a"})["items"] == []  # reads take no permits
        assert c.client.get("/healthz").status_code == 200
        gate.hold.set()
        assert [d["action"] for d in blocker.result(60)] == ["ADD", "ADD"]
    assert c.write("load/a", "Room again.")[0]["action"] == "ADD"
    assert grpc_client.write([Fact("load/a", "And over gRPC.")]).decisions[0].action == "add"
    sample = metrics.registry.get_sample_value
    assert sample("memgate_requests_total", {"rpc": "Write", "code": "RESOURCE_EXHAUSTED"}) == 1
    assert sample("memgate_requests_total", {"rpc": "Write", "code": "OK"}) == 3


def test_unknown_errors_are_500_with_a_request_id_only(h: HttpHarness) -> None:
    gate = h.gate()
    c = h.http(serve(h, gate))
    gate.fail = RuntimeError("secret-internal-detail at /srv/memgate/memgate.db")
    r = c.post("Write", {"facts": [{"namespace": "oops/a", "text": "This write meets a bug."}]})
    message = error(r, 500, "INTERNAL")
    assert r.headers["x-request-id"] in message and "secret" not in message
    gate.fail = None
    assert c.write("oops/a", "Fine again.")[0]["action"] == "ADD"


# -- backfill: NDJSON ------------------------------------------------------------------------------
def ndjson(*lines: Any) -> bytes:
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def test_backfill_streams_ndjson_decisions_in_order(h: HttpHarness) -> None:
    c = h.http(serve(h))
    ns = "bulk/a"
    texts = [DENVER, "Alice's cat is called Tom.", CHICAGO, "Bob plays the cello."]
    body = ndjson(*({"fact": {"namespace": ns, "text": t}} for t in texts))
    out: list[dict[str, Any]] = []
    with c.client.stream(
        "POST", "/v1/Backfill", content=body, headers={"content-type": "application/x-ndjson"}
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        assert r.headers["x-request-id"]
        out = [json.loads(line) for line in r.iter_lines() if line]
    assert [o["decision"]["index"] for o in out] == [0, 1, 2, 3]
    actions = [o["decision"]["action"] for o in out]
    assert actions == ["ADD", "ADD", "REPLACE", "ADD"]
    assert out[2]["decision"]["target_id"] == out[0]["decision"]["memory_id"]


def test_backfill_errors_before_and_after_the_first_decision(h: HttpHarness) -> None:
    st = serve(h, tokens=TOKENS)
    c = h.http(st, ACME)
    ct = {"content-type": "application/x-ndjson"}
    first_bad = c.client.post(
        "/v1/Backfill", content=b'{"fact": {"namespace": "acme/a"', headers=ct
    )
    error(first_bad, 400, "INVALID_ARGUMENT")
    foreign = ndjson({"fact": {"namespace": "globex/a", "text": "Bob likes tea."}})
    error(c.client.post("/v1/Backfill", content=foreign, headers=ct), 403, "PERMISSION_DENIED")
    error(
        h.http(st).client.post("/v1/Backfill", content=foreign, headers=ct), 401, "UNAUTHENTICATED"
    )
    error(c.client.post("/v1/Backfill", content=foreign), 400, "INVALID_ARGUMENT")  # content type
    body = (
        ndjson(
            {"fact": {"namespace": "acme/a", "text": "Alice likes tea."}},
            {"fact": {"namespace": "acme/a", "text": "Carol likes jazz."}},
        )
        + b'{"fact": {"namespace": "acme/a", "tex": "unknown field"}}\n'
    )
    r = c.client.post("/v1/Backfill", content=body, headers=ct)
    assert r.status_code == 200
    lines = [json.loads(x) for x in r.text.splitlines()]
    assert [x["decision"]["action"] for x in lines[:2]] == ["ADD", "ADD"]
    assert (
        lines[2]["error"]["code"] == "INVALID_ARGUMENT" and "line 3" in lines[2]["error"]["message"]
    )
    assert lines[2]["error"]["request_id"] == r.headers["x-request-id"] and len(lines) == 3


# -- OpenAPI, health, curl -------------------------------------------------------------------------
def test_openapi_lists_every_rpc_from_the_descriptors(h: HttpHarness) -> None:
    c = h.http(serve(h))
    doc = c.client.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    rpcs = [m.name for m in pb.DESCRIPTOR.services_by_name["Memgate"].methods]
    assert sorted(p for p in doc["paths"] if p.startswith("/v1/")) == sorted(
        f"/v1/{r}" for r in rpcs
    )
    fact = doc["components"]["schemas"]["memgate.v1.Fact"]["properties"]
    assert set(fact) == {f.name for f in pb.Fact.DESCRIPTOR.fields}
    assert fact["text"]["type"] == "string" and "plain JSON string" in fact["text"]["description"]
    assert "application/x-ndjson" in doc["paths"]["/v1/Backfill"]["post"]["requestBody"]["content"]
    assert SERVICE_NAME in doc["info"]["description"]


def test_health_turns_503_when_stopping(h: HttpHarness) -> None:
    gate = h.gate()
    st = serve(h, gate)
    c = h.http(st)
    assert c.client.get("/healthz").status_code == 200
    future = st.stop_async(grace=2.0)
    future.result(60)
    with pytest.raises(httpx.TransportError):
        c.client.get("/healthz")


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_curl_writes_recalls_and_reads_errors(h: HttpHarness) -> None:
    st = serve(h, tokens=TOKENS)
    assert st.server is not None
    base = f"http://127.0.0.1:{st.server.http_port}"

    def curl(rpc: str, body: str, token: str | None = ACME) -> tuple[int, dict[str, Any]]:
        cmd = [
            "curl",
            "-sS",
            "-X",
            "POST",
            f"{base}/v1/{rpc}",
            "-H",
            "content-type: application/json",
        ]
        if token:
            cmd += ["-H", f"authorization: Bearer {token}"]
        cmd += ["--data-binary", body, "-w", "\n%{http_code}"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
        text, status = out.rsplit("\n", 1)
        return int(status), json.loads(text)

    write = json.dumps({"facts": [{"namespace": "acme/c", "text": DENVER}]})
    status, body = curl("Write", write)
    assert status == 200 and body["decisions"][0]["action"] == "ADD"
    status, body = curl("Write", json.dumps({"facts": [{"namespace": "acme/c", "text": CHICAGO}]}))
    assert status == 200 and body["decisions"][0]["action"] == "REPLACE"
    status, body = curl("Recall", json.dumps({"namespace": "acme/c", "query": QUERY, "k": 1}))
    assert status == 200 and body["hits"][0]["memory"]["text"] == CHICAGO
    assert curl("Write", "{oops")[0] == 400
    status, body = curl("Write", write, token=None)
    assert (status, body["code"]) == (401, "UNAUTHENTICATED")
    status, body = curl("Recall", json.dumps({"namespace": "globex/c", "query": QUERY}))
    assert (status, body["code"]) == (403, "PERMISSION_DENIED")
    nd = ndjson({"fact": {"namespace": "acme/c", "text": "Alice likes tea."}}).decode()
    out = subprocess.run(
        [
            "curl",
            "-sS",
            "-N",
            "-X",
            "POST",
            f"{base}/v1/Backfill",
            "-H",
            f"authorization: Bearer {ACME}",
            "-H",
            "content-type: application/x-ndjson",
            "--data-binary",
            "@-",
        ],
        input=nd,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert [json.loads(x)["decision"]["action"] for x in out.splitlines()] == ["ADD"]


def test_the_listener_is_tcp_with_nodelay(h: HttpHarness) -> None:
    """asyncio turns Nagle off only on sockets whose proto says TCP; with it on, every response
    waited ~40 ms for the client's delayed ACK (found by bench_grpc's store-read arm)."""
    import socket

    st = serve(h)
    assert st.server is not None
    sock = st.server._http._socket  # noqa: SLF001 - the listener the door bound
    assert sock.proto == socket.IPPROTO_TCP
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
