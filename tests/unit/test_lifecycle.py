"""engine.lifecycle: what "active" means now and at a point of the log. Pure, no store."""

from __future__ import annotations

import random
from datetime import UTC, datetime
from typing import Any

import pytest

from engine.errors import InvalidInput
from engine.lifecycle import (
    AsOf,
    Hidden,
    LogEvent,
    State,
    expiry_time,
    is_active,
    parse_as_of,
    state_untouched,
    status_at,
    status_now,
)


def ev(seq: int, type_: str, mem: str | None, target: str | None = None, **kw: object) -> LogEvent:
    return LogEvent(seq, type_, mem, target, float(seq * 10), **kw)  # type: ignore[arg-type]


def test_parse_as_of() -> None:
    assert parse_as_of("") is None and parse_as_of("  ") is None
    assert parse_as_of("42") == AsOf(seq=42)
    when = datetime(2026, 3, 1, 9, 30, tzinfo=UTC).timestamp()
    assert parse_as_of("2026-03-01T09:30:00Z") == AsOf(time=when)
    assert parse_as_of("2026-03-01T10:30:00+01:00") == AsOf(time=when)
    assert parse_as_of("2026-03-01T09:30:00.250Z") == AsOf(time=when + 0.25)
    for bad in ("yesterday", "2026-03-01", "2026-03-01T09:30:00", "-3", "1e3", "x" * 80):
        with pytest.raises(InvalidInput):
            parse_as_of(bad)
    with pytest.raises(InvalidInput):
        AsOf(seq=1, time=2.0)
    with pytest.raises(InvalidInput):
        AsOf()


def test_expiry_time() -> None:
    assert expiry_time(100.0, None, None, None) is None
    assert expiry_time(100.0, 500.0, None, 10.0) == 500.0  # the fact's own time wins
    assert expiry_time(100.0, None, 30.0, 10.0) == 130.0  # then its ttl
    assert expiry_time(100.0, None, None, 10.0) == 110.0  # then the kind's default
    for args in ((1.0, 1.0), (None, 0.0), (None, -5.0), (None, float("inf")), (-1.0, None)):
        with pytest.raises(InvalidInput):
            expiry_time(100.0, args[0], args[1], None)


def test_active_now_is_status_and_time() -> None:
    assert is_active("active", None, 1e12)
    assert is_active("active", 101.0, 100.0)
    assert not is_active("active", 100.0, 100.0)  # expires_at itself is expired
    assert not is_active("superseded", None, 0.0)
    assert status_now("active", 100.0, 100.0) == "expired"
    assert status_now("superseded", 100.0, 200.0) == "superseded"


def test_status_at_replays_add_replace_undo_forget_expire() -> None:
    log = [
        ev(1, "add", "a"),
        ev(2, "replace", "b", "a"),
        ev(3, "undo", "b", "a"),
        ev(4, "skip", None, "a"),
        ev(5, "review_resolved", "c", "a", accepted=True),
        ev(6, "expire", "c"),
    ]

    def at(mem: str, seq: int, **kw: object) -> State | None:
        opts: dict[str, object] = {"expires_at": None, "forgotten_now": False, **kw}
        return status_at(mem, log, seq, seq * 10.0, **opts)  # type: ignore[arg-type]

    assert at("a", 0) is None
    assert at("a", 1) == State("active")
    assert at("a", 2) == State("superseded", 20.0)
    assert at("b", 2) == State("active") and at("b", 1) is None
    assert at("a", 3) == State("active") and at("b", 3) == State("undone", 30.0)
    assert at("a", 4) == State("active")  # a skip changes nothing
    assert at("a", 5) == State("superseded", 50.0) and at("c", 5) == State("active")
    assert at("c", 6, expires_at=55.0) == State("expired", 55.0)
    # Expiry is by time, whether or not the sweep wrote its event yet.
    assert at("c", 5, expires_at=45.0) == State("expired", 45.0)
    # Erasure wins: forgotten now is forgotten at every point it existed, never before.
    assert at("a", 1, forgotten_now=True) == State("forgotten", None)
    assert at("a", 0, forgotten_now=True) is None


def test_keep_both_resolution_does_not_supersede() -> None:
    log = [ev(1, "add", "a"), ev(2, "review_resolved", "b", "a", accepted=False)]
    opts = {"expires_at": None, "forgotten_now": False}
    assert status_at("a", log, 2, 20.0, **opts) == State("active")  # type: ignore[arg-type]
    assert status_at("b", log, 2, 20.0, **opts) == State("active")  # type: ignore[arg-type]


def test_untouched_memories_keep_their_status_up_to_expiry() -> None:
    assert state_untouched("superseded", None, 7.0, 100.0) == State("superseded", 7.0)
    assert state_untouched("active", None, None, 100.0) == State("active")
    assert state_untouched("active", 150.0, None, 100.0) == State("active")
    assert state_untouched("expired", 50.0, 50.0, 100.0) == State("expired", 50.0)
    # Read now as expired (lazily), but at an earlier point it was still active.
    assert state_untouched("expired", 150.0, 150.0, 100.0) == State("active")


def test_status_at_forward_replay_matches_the_store_rules_on_random_logs() -> None:
    # A tiny model of the store (add / replace / undo / forget) generates logs; the replay of
    # each memory's own events must give the model's status after every prefix of the log.
    rng = random.Random(7)
    for _ in range(200):
        status: dict[str, str] = {}
        supersedes: dict[str, str] = {}
        log: list[LogEvent] = []
        history: list[dict[str, str]] = []
        for seq in range(1, 25):
            active = [m for m, s in status.items() if s == "active"]
            move = rng.choice(["add", "replace", "undo", "forget"])
            new = f"m{seq}"
            if move == "add" or not active:
                status[new] = "active"
                log.append(ev(seq, "add", new))
            elif move == "replace":
                old = rng.choice(active)
                status[old], status[new], supersedes[new] = "superseded", "active", old
                log.append(ev(seq, "replace", new, old))
            elif move == "undo":
                cands = [
                    m for m in active if m in supersedes and status[supersedes[m]] == "superseded"
                ]
                if not cands:
                    status[new] = "active"
                    log.append(ev(seq, "add", new))
                else:
                    m = rng.choice(cands)
                    status[m], status[supersedes[m]] = "undone", "active"
                    log.append(ev(seq, "undo", m, supersedes[m]))
            else:
                m = rng.choice(sorted(status))
                if status[m] != "forgotten":
                    status[m] = "forgotten"
                    log.append(ev(seq, "forget", m))
            history.append(dict(status))
        final = history[-1]
        for seq, snapshot in enumerate(history, start=1):
            for m in final:
                mine = [e for e in log if m in (e.memory_id, e.target_id)]
                got = status_at(
                    m,
                    mine,
                    seq,
                    seq * 10.0,
                    expires_at=None,
                    forgotten_now=final[m] == "forgotten",
                )
                if m not in snapshot:
                    assert got is None
                elif final[m] == "forgotten":
                    assert got is not None and got.status == "forgotten"
                else:
                    assert got is not None and got.status == snapshot[m], (m, seq)


def test_hidden_counts() -> None:
    h = Hidden.of(["superseded", "superseded", "expired", "active", "undone"], partial=True)
    assert (h.superseded, h.expired, h.undone, h.forgotten, h.total) == (2, 1, 1, 0, 4)
    assert h.partial and Hidden().total == 0


def test_policy_default_ttl_per_kind() -> None:
    import json
    import tempfile
    from pathlib import Path

    from engine.gate.policy import STRICT
    from engine.tuning.policy_file import load_policy_file

    assert STRICT.ttl_for("episodic") is None
    pol = STRICT.with_overrides({"episodic_ttl_s": 3600.0, "procedural_ttl_s": 60})
    assert (pol.ttl_for("episodic"), pol.ttl_for("semantic"), pol.ttl_for("procedural")) == (
        3600.0,
        None,
        60,
    )
    for bad in (0.0, -1.0, float("nan"), float("inf"), 1e12, "1h"):
        with pytest.raises(InvalidInput):
            STRICT.with_overrides({"semantic_ttl_s": bad})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "policy.json"
        body = {"format": "memgate-policy/1", "base": "strict"}
        path.write_text(json.dumps({**body, "overrides": {"episodic_ttl_s": 86400}}))
        loaded = load_policy_file(path)
        assert loaded.policy.ttl_for("episodic") == 86400
        path.write_text(json.dumps({**body, "overrides": {"episodic_ttl_s": "1d"}}))
        with pytest.raises(InvalidInput):
            load_policy_file(path)


def test_jsonl_facts_carry_their_expiry(tmp_path: Any) -> None:
    import json

    from engine.facts import read_facts

    path = tmp_path / "facts.jsonl"
    rows = [
        {"namespace": "a/b", "text": "OTP 1234", "ttl_s": 60},
        {"namespace": "a/b", "text": "Hold", "expires_at": 1.7e9},
        {"namespace": "a/b", "text": "Plain"},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows), encoding="utf-8")
    facts = list(read_facts(str(path)))
    assert [(f.ttl_s, f.expires_at) for f in facts] == [(60.0, None), (None, 1.7e9), (None, None)]
    path.write_text(json.dumps({"namespace": "a/b", "text": "x", "ttl_s": "1h"}), "utf-8")
    with pytest.raises(InvalidInput, match="ttl_s"):
        list(read_facts(str(path)))
