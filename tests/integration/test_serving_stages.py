"""Issue 34 on a real server (real MiniLM and NLI, SQLite, gRPC on loopback): the models are
warm and the admission estimate primed before SERVING, so a fresh server admits a 64-fact
write with a 30 s deadline on its first call; forwards run on the model stage; health turns
NOT_SERVING while the model stage makes no progress with work waiting, and SERVING after."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from engine.server.codegen import ensure

ensure()

from engine.client import MemgateClient  # noqa: E402
from engine.core.stage import Staged  # noqa: E402
from engine.server import ServerSettings, ServerThread  # noqa: E402
from engine.types import Fact  # noqa: E402


def _wait_health(client: MemgateClient, want: str, tries: int = 400) -> str:
    got = ""
    for _ in range(tries):
        got = client.health()
        if got == want:
            return got
        time.sleep(0.05)
    return got


def test_a_fresh_server_is_warm_and_admits_64_facts_at_a_30s_deadline(
    make_gate: Callable[..., Any],
) -> None:
    gate = make_gate()
    st = ServerThread(gate, ServerSettings(port=0))
    st.start()
    try:
        server = st.server
        assert server is not None
        engine = server.engine
        # Warm before SERVING: forwards already ran, the estimate is primed by the models.
        assert engine.stage.forwards >= 2 and engine.seconds_per_fact is not None
        assert isinstance(gate.embedder, Staged) and isinstance(gate.nli, Staged)
        facts = [
            Fact("fresh/first", f"Note {i}: the quarterly report lists {i} open items.")
            for i in range(64)
        ]
        with MemgateClient(st.target, timeout=30.0, retry=False) as client:
            out = client.write(facts)
        assert len(out.decisions) == 64 and all(d.memory_id for d in out.decisions)
    finally:
        st.stop(grace=0)


def test_health_is_not_serving_while_the_model_stage_is_stuck(
    make_gate: Callable[..., Any],
) -> None:
    st = ServerThread(make_gate(), ServerSettings(port=0, stall_s=0.5))
    st.start()
    release = threading.Event()
    try:
        server = st.server
        assert server is not None
        stage = server.engine.stage
        with MemgateClient(st.target, timeout=10.0, retry=False) as client:
            assert client.health() == "SERVING"
            # A forward that does not finish (a wedged runtime) while work waits on it.
            stuck = threading.Thread(target=stage.run, args=(release.wait, 60), daemon=True)
            stuck.start()
            down = _wait_health(client, "NOT_SERVING")
            release.set()
            stuck.join(30)
            up = _wait_health(client, "SERVING")
            [d] = client.write([Fact("stall/after", "The stage moves again.")]).decisions
        assert down == "NOT_SERVING" and up == "SERVING" and d.memory_id
    finally:
        release.set()
        st.stop(grace=0)


def test_staged_models_score_exactly_as_the_runtimes_do(models: tuple[Any, Any]) -> None:
    from engine.core.stage import ModelStage

    embedder, nli = models
    pairs = [
        (f"The user owns {i} cats and a dog.", f"The user owns {i % 3} cats.") for i in range(40)
    ]
    texts = [p[0] for p in pairs]
    stage = ModelStage()
    before = nli.max_batch
    try:
        nli.max_batch = 8  # five forward passes of one model call
        staged = Staged(nli, stage).score(pairs)
        direct = nli.score(pairs)
        vecs = Staged(embedder, stage).embed(texts)
    finally:
        nli.max_batch = before
        stage.close()
    assert (staged == direct).all()
    assert (vecs == embedder.embed(texts)).all()
    assert stage.forwards == 2


def test_staged_calls_cut_and_merged_by_pair_tokens_score_exactly(models: tuple[Any, Any]) -> None:
    # Long and short pairs from two lanes at once under a small pair-token budget: the long
    # call goes in several trips, merged with the short one where it fits, and every row is
    # what one direct call gives (row invariance; the stage only regroups rows).
    from engine.core.stage import Budget, ModelStage, StageSettings

    _, nli = models
    paragraph = " ".join(f"In {2000 + i} the user moved house and changed jobs." for i in range(30))
    long = [(paragraph, f"The user moved in {2000 + i}.") for i in range(12)]
    short = [(f"The user owns {i} cats.", f"The user owns {i % 3} cats.") for i in range(12)]
    stage = ModelStage(StageSettings(nli=Budget(tokens=512, chunk_tokens=400)))
    staged = Staged(nli, stage)
    out: dict[str, Any] = {}
    try:
        lanes = [
            threading.Thread(target=lambda k=k, p=p: out.__setitem__(k, staged.score(p)))
            for k, p in (("long", long), ("short", short))
        ]
        for t in lanes:
            t.start()
        for t in lanes:
            t.join(120)
    finally:
        stage.close()
    assert (out["long"] == nli.score(long)).all() and (out["short"] == nli.score(short)).all()
    assert stage.forwards >= len(long) * max(len(e.ids) for e in nli.encode(long)) // 512


def test_a_live_holder_renews_its_namespace_lock_past_the_idle_bound(pg_dsn: str) -> None:
    # The decision's model work runs between the lock and the commit with no statement on the
    # held connection; the lease heartbeat keeps PostgreSQL's idle-in-transaction bound (here
    # 1 s) from ending a live holder's session. (A frozen holder, whose heartbeat freezes too,
    # loses it: tests/reliability/test_replicas_kill.py.)
    import psycopg

    from engine.store import StoreSettings
    from engine.store.postgres import PostgresStore

    def held() -> bool:
        # A fresh database: the only advisory lock in it is the namespace's.
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND "
                "database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()
        return bool(row and row[0])

    with PostgresStore(pg_dsn, StoreSettings(lock_hold_s=1.0)) as store:
        with store.lock_namespaces({"lease/ns"}):
            assert held()
            time.sleep(3.5)  # three idle bounds without a statement of the holder's own
            still = held()
        assert not held()
    assert still
