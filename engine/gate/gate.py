"""The write gate: batch triage of incoming facts against a namespace's stored memories.

One batch, any mix of namespaces, is decided with one embedder call, one grouped index search per
namespace and one NLI call over every candidate pair. Facts are then decided in order, so a later
fact sees what earlier facts of the same batch did (two updates of one attribute: the second
supersedes the first and the chain is kept). ``apply=True`` commits every decision in one store
transaction and then moves the indexes; a dry run decides only.
"""

from __future__ import annotations

import re
import threading
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from dataclasses import replace as dc_replace
from typing import Any, Protocol

import numpy as np

from engine.errors import InvalidInput
from engine.gate import keys as keymod
from engine.gate import normalize as normmod
from engine.gate import overlap
from engine.gate.policy import Evidence, Policy, decide, policy_by_name
from engine.store import Write, WriteResult, new_memory_id
from engine.types import KINDS, Candidate, Decision, Fact, Memory
from engine.validation import is_namespace

__all__ = ["EmbedderLike", "Gate", "GateSettings", "NLILike", "TriageResult"]


class EmbedderLike(Protocol):
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class NLILike(Protocol):
    contradiction_index: int
    entailment_index: int | None

    def score(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray: ...


@dataclass(frozen=True)
class GateSettings:
    """Limits of the gate. Every field is range-checked."""

    max_batch: int = 2048
    """Most facts in one triage call."""
    max_text_chars: int = 8192
    """Longest accepted fact text (characters). Longer texts are refused, never silently cut."""
    max_metadata_bytes: int = 16384

    def __post_init__(self) -> None:
        if not 1 <= self.max_batch <= 1_000_000:
            raise InvalidInput("max_batch must be in [1, 1000000]")
        if not 1 <= self.max_text_chars <= 1_000_000:
            raise InvalidInput("max_text_chars must be in [1, 1000000]")


@dataclass
class TriageResult:
    decisions: list[Decision]
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per phase: embed, search, nli, decide, store."""
    nli_pairs: int = 0


@dataclass
class _Ref:
    """A memory the gate can compare against: stored (rowid >= 0) or earlier in this batch."""

    memory_id: str
    text: str
    key: str | None
    inferred_key: str | None
    rowid: int | None = None


def validate_fact(fact: Fact, settings: GateSettings) -> None:
    if not is_namespace(fact.namespace):  # the one rule of every entry point
        raise InvalidInput(
            "namespace must be 1-128 characters of letters, digits and _ . : / @ -, "
            "starting with a letter or digit"
        )
    if not isinstance(fact.text, str) or not fact.text.strip():
        raise InvalidInput("fact text is empty")
    if len(fact.text) > settings.max_text_chars:
        raise InvalidInput(
            f"fact text has {len(fact.text)} characters; the limit is {settings.max_text_chars}"
        )
    if "\x00" in fact.text:
        raise InvalidInput("fact text contains a NUL character")
    if fact.kind not in KINDS:
        raise InvalidInput(f"unknown kind {fact.kind!r}: choose one of {', '.join(KINDS)}")
    if fact.key is not None and (not fact.key.strip() or len(fact.key) > 256):
        raise InvalidInput("key must be 1-256 characters")
    if fact.idempotency_key is not None and not 1 <= len(fact.idempotency_key) <= 128:
        raise InvalidInput("idempotency_key must be 1-128 characters")


def _same_text(a: str, b: str) -> bool:
    return " ".join(a.split()).casefold() == " ".join(b.split()).casefold()


class Gate:
    """Decides, and optionally commits, batches of facts. Thread-safe per namespace."""

    def __init__(
        self,
        store: Any,
        index: Any,
        embedder: EmbedderLike,
        nli: NLILike,
        settings: GateSettings | None = None,
    ) -> None:
        self.store = store
        self.index = index
        self.embedder = embedder
        self.nli = nli
        self.settings = settings or GateSettings()
        self._locks: dict[str, threading.Lock] = defaultdict(threading.Lock)
        self._locks_guard = threading.Lock()

    # -- locking -------------------------------------------------------------------------
    @contextmanager
    def namespaces_locked(self, namespaces: set[str]) -> Iterator[None]:
        """Serialise writers per namespace; sorted acquisition cannot deadlock."""
        with self._locks_guard:
            locks = [self._locks[ns] for ns in sorted(namespaces)]
        with ExitStack() as stack:
            for lock in locks:
                stack.enter_context(lock)
            if hasattr(self.store, "lock_namespaces"):  # across replicas (PostgreSQL)
                stack.enter_context(self.store.lock_namespaces(namespaces))
            yield

    # -- triage --------------------------------------------------------------------------
    def triage(
        self,
        facts: Sequence[Fact],
        policy: Policy | str = "strict",
        *,
        apply: bool = False,
        overrides: dict[str, Any] | None = None,
    ) -> TriageResult:
        pol = policy_by_name(policy) if isinstance(policy, str) else policy
        pol = pol.with_overrides(overrides)
        if len(facts) > self.settings.max_batch:
            raise InvalidInput(
                f"batch of {len(facts)} facts; the limit is {self.settings.max_batch}"
            )
        for fact in facts:
            validate_fact(fact, self.settings)
        if not facts:
            return TriageResult(decisions=[])
        if not apply:
            return self._triage_replays(facts, pol, apply=False)
        with self.namespaces_locked({f.namespace for f in facts}):
            return self._triage_replays(facts, pol, apply=True)

    # -- idempotent replays ------------------------------------------------------------------
    def _triage_replays(self, facts: Sequence[Fact], pol: Policy, *, apply: bool) -> TriageResult:
        """Set replays aside, decide the rest, and put the replays back in their places.

        A fact whose idempotency key the store already holds, or that repeats the key of an
        earlier fact of this batch, is a *replay*: it answers the recorded result (or that
        earlier fact's) and takes no part in the decisions. Left in, it would be decided afresh
        and could hand a later fact of the batch an in-batch target (a memory id it assigned)
        that its replayed commit never stores, or hide a memory its stale decision replaced.
        Runs under the namespace locks when ``apply``, so no other writer of this engine can
        commit one of these keys between the look-up and the commit.
        """
        recorded = self._recorded(facts)
        first: dict[tuple[str, str], int] = {}
        replay_of: dict[int, int] = {}  # index -> earlier index of this batch with the same key
        for i, fact in enumerate(facts):
            if fact.idempotency_key is None or i in recorded:
                continue
            slot = (fact.namespace, fact.idempotency_key)
            if slot in first:
                replay_of[i] = first[slot]
            else:
                first[slot] = i
        if not recorded and not replay_of:
            return self._triage(facts, pol, apply=apply)
        live = [i for i in range(len(facts)) if i not in recorded and i not in replay_of]
        result = (
            self._triage([facts[i] for i in live], pol, apply=apply)
            if live
            else TriageResult(decisions=[])
        )
        decided = dict(zip(live, result.decisions, strict=True))
        decisions: list[Decision] = []
        for i, fact in enumerate(facts):
            if i in recorded:
                r = recorded[i]
                decisions.append(
                    Decision(
                        r.action,
                        fact,
                        r.target_id,
                        (),
                        pol.name,
                        "replayed",
                        memory_id=r.memory_id,
                        review_id=r.review_id,
                        replayed=True,
                    )
                )
            elif i in replay_of:
                d = decided[replay_of[i]]
                decisions.append(dc_replace(d, fact=fact, replayed=True))
            else:
                decisions.append(decided[i])
        result.decisions = decisions
        return result

    def _recorded(self, facts: Sequence[Fact]) -> dict[int, WriteResult]:
        """The store's recorded result for every fact whose idempotency key it already holds."""
        keys: dict[str, list[int]] = defaultdict(list)
        for i, fact in enumerate(facts):
            if fact.idempotency_key is not None:
                keys[fact.namespace].append(i)
        out: dict[int, WriteResult] = {}
        for ns, idx in keys.items():
            found = self.store.idempotent_results(ns, [facts[i].idempotency_key for i in idx])
            for i in idx:
                r = found.get(facts[i].idempotency_key)
                if r is not None:
                    out[i] = r
        return out

    def _triage(self, facts: Sequence[Fact], pol: Policy, *, apply: bool) -> TriageResult:
        timings: dict[str, float] = {}
        checked = [i for i, f in enumerate(facts) if f.kind != "episodic" and f.key is None]
        norm = {i: normmod.normalize(facts[i].text) for i in checked} if pol.normalize else {}
        # Extra recall queries: the current-state rewrite of an event-phrased fact, and the old
        # state a "no longer" fact negates (an event is often far from the stored state in
        # embedding space; its rewrite and its old state are not).
        queries: list[tuple[int, str]] = []
        for i in checked:
            if i in norm and norm[i].rule:
                queries.append((i, norm[i].hypothesis))
                old_state = _old_state(norm[i])
                if old_state:
                    queries.append((i, old_state))
        t0 = time.perf_counter()
        embedded = self.embedder.embed([f.text for f in facts] + [q for _, q in queries])
        vectors = embedded[: len(facts)]
        extra: dict[int, list[np.ndarray]] = defaultdict(list)
        for n, (i, _) in enumerate(queries):
            extra[i].append(embedded[len(facts) + n])
        timings["embed"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        recalled = self._recall(facts, vectors, extra, checked, pol.top_k)
        timings["search"] = time.perf_counter() - t0

        inferred = {
            i: keymod.infer_key(f.text) for i, f in enumerate(facts) if f.kind != "episodic"
        }

        # Candidate sets: stored neighbours plus earlier facts of this batch in the namespace.
        cand: dict[int, list[tuple[_Ref, float]]] = {}
        for i in checked:
            pool = list(recalled.get(i, []))
            for j in range(i):
                fj = facts[j]
                if fj.namespace == facts[i].namespace and fj.kind != "episodic" and fj.key is None:
                    ref = _Ref(f"@{j}", fj.text, fj.key, _key_str(inferred.get(j)))
                    sim = max(float(q @ vectors[j]) for q in [vectors[i], *extra.get(i, [])])
                    pool.append((ref, sim))
            pool.sort(key=lambda rs: -rs[1])
            cand[i] = pool[: pol.top_k + i]  # earlier in-batch facts never crowd out stored ones

        low = min(pol.floor, pol.key_match_floor)
        relations: dict[tuple[int, str], Any] = {}
        pairs: list[tuple[str, str]] = []
        pair_at: dict[tuple[int, str, str], int] = {}
        for i in checked:
            hyp = norm[i].hypothesis if i in norm else facts[i].text
            for rank, (ref, sim) in enumerate(cand[i]):
                if sim < low:
                    continue
                rel = (
                    keymod.relate(facts[i].text, ref.text, facts[i].key, ref.key)
                    if pol.keys
                    else None
                )
                if pol.keys and rel is not None and not rel.key_match and not rel.key_conflict:
                    rel = _old_value_match(norm.get(i), ref.text) or rel
                    if (
                        not rel.key_match
                        and sim >= pol.value_change_similarity
                        and pol.lexical
                        and overlap.value_change(ref.text, facts[i].text)
                    ):
                        rel = keymod.Relation(
                            key_match=True, key_conflict=False, reason="value_change"
                        )
                relations[(i, ref.memory_id)] = rel
                if rel is not None and rel.key_conflict:
                    continue  # a sibling is never replaced: no need to ask the model
                if sim < pol.floor and not (rel is not None and rel.key_match):
                    continue
                pair_at[(i, ref.memory_id, "fwd")] = len(pairs)
                pairs.append((ref.text, hyp))
                if (
                    rank == 0
                    and sim >= pol.duplicate_similarity
                    and self.nli.entailment_index is not None
                ):
                    pair_at[(i, ref.memory_id, "rev")] = len(pairs)
                    pairs.append((facts[i].text, ref.text))

        t0 = time.perf_counter()
        probs = self.nli.score(pairs) if pairs else np.zeros((0, 2), dtype=np.float32)
        # Verification: a candidate that conflicts forward is also scored the other way round
        # (new fact = premise). A real update contradicts both ways; a refinement or a
        # restatement ("studying law" <- "second year of law at Leiden") does not.
        if pol.verify_reverse and len(pairs):
            ci = self.nli.contradiction_index
            bar = min(pol.contradiction, pol.key_match_contradiction)
            extra_pairs: list[tuple[str, str]] = []
            for (i, mid, way), at in list(pair_at.items()):
                if way == "fwd" and probs[at, ci] > bar and (i, mid, "rev") not in pair_at:
                    pair_at[(i, mid, "rev")] = len(pairs) + len(extra_pairs)
                    extra_pairs.append((facts[i].text, pairs[at][0]))
            if extra_pairs:
                pairs.extend(extra_pairs)
                probs = np.concatenate([probs, self.nli.score(extra_pairs)])
        timings["nli"] = time.perf_counter() - t0

        t0 = time.perf_counter()
        decisions = self._decide_in_order(
            facts, pol, cand, relations, probs, pair_at, norm, inferred
        )
        timings["decide"] = time.perf_counter() - t0

        if apply:
            t0 = time.perf_counter()
            decisions = self._commit(decisions, vectors, pol.name)
            timings["store"] = time.perf_counter() - t0
        return TriageResult(decisions=decisions, timings=timings, nli_pairs=len(pairs))

    def _recall(
        self,
        facts: Sequence[Fact],
        vectors: np.ndarray,
        extra: dict[int, list[np.ndarray]],
        checked: list[int],
        k: int,
    ) -> dict[int, list[tuple[_Ref, float]]]:
        """Top-k stored neighbours per fact; a rewritten fact searches with both vectors."""
        by_ns: dict[str, list[tuple[int, np.ndarray]]] = defaultdict(list)
        for i in checked:
            by_ns[facts[i].namespace].append((i, vectors[i]))
            for q in extra.get(i, []):
                by_ns[facts[i].namespace].append((i, q))
        out: dict[int, list[tuple[_Ref, float]]] = {}
        for ns, queries in by_ns.items():
            scores, rowids = self.index.search(ns, np.stack([q for _, q in queries]), k)
            wanted = {int(r) for r in rowids.ravel() if r >= 0}
            refs = self.store.texts_for_rowids(ns, sorted(wanted)) if wanted else {}
            best: dict[int, dict[int, float]] = defaultdict(dict)
            for row, (i, _) in enumerate(queries):
                for s, r in zip(scores[row], rowids[row], strict=True):
                    if r >= 0 and best[i].get(int(r), -2.0) < s:
                        best[i][int(r)] = float(s)
            for i, hits in best.items():
                ranked = sorted(hits.items(), key=lambda rs: -rs[1])[:k]
                out[i] = [
                    (_Ref(ref.id, ref.text, ref.key, ref.inferred_key, r), s)
                    for r, s in ranked
                    if (ref := refs.get(r)) is not None and ref.kind != "episodic"
                ]
        return out

    def _decide_in_order(
        self,
        facts: Sequence[Fact],
        pol: Policy,
        cand: dict[int, list[tuple[_Ref, float]]],
        relations: dict[tuple[int, str], Any],
        probs: np.ndarray,
        pair_at: dict[tuple[int, str, str], int],
        norm: dict[int, Any],
        inferred: dict[int, Any],
    ) -> list[Decision]:
        ci, ei = self.nli.contradiction_index, self.nli.entailment_index
        decisions: list[Decision] = []
        # In-batch state: ids given to earlier facts, memories they superseded, keyed slots.
        batch_id: dict[str, str] = {}
        gone: set[str] = set()
        keyed: dict[tuple[str, str], tuple[str, str]] = {}
        for i, fact in enumerate(facts):
            new_id = new_memory_id()
            ikey = _key_str(inferred.get(i))
            hyp = norm[i].hypothesis if i in norm and norm[i].rule else None
            if fact.kind == "episodic":
                d = Decision("add", fact, None, (), pol.name, "episodic", memory_id=new_id)
            elif fact.key is not None:
                d = self._decide_keyed(fact, pol, keyed, gone, new_id, ikey)
            else:
                evidence = []
                lexical, low = pol.lexical, min(pol.floor, pol.key_match_floor)
                for ref, sim in cand[i]:
                    mid = batch_id.get(ref.memory_id, ref.memory_id)
                    if mid in gone or mid.startswith("@"):
                        continue  # superseded earlier in this batch, or that fact stored nothing
                    rel = relations.get((i, ref.memory_id))
                    fwd = pair_at.get((i, ref.memory_id, "fwd"))
                    rev = pair_at.get((i, ref.memory_id, "rev"))
                    evidence.append(
                        Evidence(
                            memory_id=mid,
                            text=ref.text,
                            similarity=sim,
                            contradiction=None if fwd is None else float(probs[fwd, ci]),
                            entailment=None if fwd is None or ei is None else float(probs[fwd, ei]),
                            reverse_contradiction=None if rev is None else float(probs[rev, ci]),
                            reverse_entailment=None
                            if rev is None or ei is None
                            else float(probs[rev, ei]),
                            key=ref.key or ref.inferred_key,
                            key_match=bool(rel and rel.key_match),
                            key_conflict=bool(rel and rel.key_conflict),
                            conflict_reason=getattr(rel, "reason", "") if rel else "",
                            # lexical evidence only where it can matter: above the floor
                            contained=lexical
                            and sim >= low
                            and overlap.contains(ref.text, fact.text),
                            partial=lexical
                            and sim >= low
                            and overlap.claims(ref.text, fact.text).partial,
                        )
                    )
                v = decide(evidence, pol)
                rule = v.rule
                if hyp and v.action in ("replace", "review"):
                    rule = f"{rule}+normalized:{norm[i].rule}"
                d = Decision(
                    v.action,
                    fact,
                    v.target_id,
                    v.candidates,
                    pol.name,
                    rule,
                    hypothesis=hyp,
                    inferred_key=ikey,
                    memory_id=new_id if v.action in ("add", "replace") else None,
                )
            if d.action in ("add", "replace") and d.memory_id:
                batch_id[f"@{i}"] = d.memory_id
            if d.action == "replace" and d.target_id:
                gone.add(d.target_id)
            decisions.append(d)
        return decisions

    def _decide_keyed(
        self,
        fact: Fact,
        pol: Policy,
        keyed: dict[tuple[str, str], tuple[str, str]],
        gone: set[str],
        new_id: str,
        ikey: str | None,
    ) -> Decision:
        assert fact.key is not None
        slot = (fact.namespace, fact.key)
        current: tuple[str, str] | None = keyed.get(slot)
        if current is None:
            mem: Memory | None = self.store.active_by_key(fact.namespace, fact.key)
            if mem is not None and mem.id not in gone:
                current = (mem.id, mem.text)
        if current is None:
            d = Decision(
                "add", fact, None, (), pol.name, "keyed_new", inferred_key=ikey, memory_id=new_id
            )
            keyed[slot] = (new_id, fact.text)
            return d
        cand = (Candidate(current[0], current[1], 1.0, None, None, fact.key, True, "same_key"),)
        if _same_text(current[1], fact.text):
            return Decision(
                "skip", fact, current[0], cand, pol.name, "keyed_same", inferred_key=ikey
            )
        keyed[slot] = (new_id, fact.text)
        return Decision(
            "replace",
            fact,
            current[0],
            cand,
            pol.name,
            "keyed",
            inferred_key=ikey,
            memory_id=new_id,
        )

    # -- reads and corrections -------------------------------------------------------------
    def get(self, namespace: str, memory_id: str) -> Memory | None:
        return self.store.get(namespace, memory_id)

    def history(self, namespace: str, memory_id: str) -> list[Memory]:
        return list(self.store.history(namespace, memory_id))

    def recall(self, namespace: str, query: str, k: int = 10) -> list[tuple[Memory, float]]:
        """The ``k`` active memories most similar to ``query`` (episodic ones included)."""
        validate_fact(Fact(namespace=namespace, text=query), self.settings)
        if not 1 <= k <= 1000:
            raise InvalidInput("k must be in [1, 1000]")
        vec = self.embedder.embed([query])
        scores, rowids = self.index.search(namespace, vec, k)
        refs = self.store.texts_for_rowids(namespace, [int(r) for r in rowids[0] if r >= 0])
        mems = self.store.get_many(
            namespace, [refs[int(r)].id for r in rowids[0] if int(r) in refs]
        )
        by_id = {m.id: m for m in mems}
        hits = []
        for s, r in zip(scores[0], rowids[0], strict=True):
            ref = refs.get(int(r))
            if ref is not None and ref.id in by_id:
                hits.append((by_id[ref.id], float(s)))
        return hits

    def forget(self, namespace: str, memory_id: str) -> str:
        """Erase a memory: its text and embedding are deleted, it leaves the index."""
        with self.namespaces_locked({namespace}):
            rowid = self.store.forget(namespace, memory_id)
            self.index.remove(namespace, np.asarray([rowid], dtype=np.int64))
        return memory_id

    def undo(self, namespace: str, memory_id: str) -> tuple[Memory, Memory]:
        """Undo the replacement made by ``memory_id``: the memory it superseded is active again."""
        with self.namespaces_locked({namespace}):
            res = self.store.undo(namespace, memory_id)
            self.index.remove(namespace, np.asarray([res.undone_rowid], dtype=np.int64))
            if res.restored_embedding is not None:
                self.index.add(
                    namespace,
                    np.asarray([res.restored_rowid], dtype=np.int64),
                    res.restored_embedding[None, :],
                )
        return res.restored, res.undone

    def list_review(self, namespace: str, limit: int = 100) -> list[Any]:
        return list(self.store.list_review(namespace, "pending", limit))

    def resolve_review(self, namespace: str, review_id: str, resolution: str) -> Any:
        """accept = replace the target, keep_both = add, reject = discard."""
        if resolution not in ("accept", "keep_both", "reject"):
            raise InvalidInput("resolution must be accept, keep_both or reject")
        with self.namespaces_locked({namespace}):
            res = self.store.resolve_review(namespace, review_id, resolution)
            if res.rowid is not None and res.embedding is not None:
                self.index.add(
                    namespace, np.asarray([res.rowid], dtype=np.int64), res.embedding[None, :]
                )
            if res.superseded_rowid is not None:
                self.index.remove(namespace, np.asarray([res.superseded_rowid], dtype=np.int64))
        return res

    def ingest(self, facts: Sequence[Fact]) -> list[Decision]:
        """Store facts as they are, without a gate decision (trusted imports, eval set-up)."""
        for fact in facts:
            validate_fact(fact, self.settings)
        if not facts:
            return []
        vectors = self.embedder.embed([f.text for f in facts])
        decisions = [
            Decision(
                "add",
                f,
                None,
                (),
                "ingest",
                "ingest",
                inferred_key=_key_str(keymod.infer_key(f.text)),
                memory_id=new_memory_id(),
            )
            for f in facts
        ]
        with self.namespaces_locked({f.namespace for f in facts}):
            return self._commit(decisions, vectors, "ingest")

    # -- commit --------------------------------------------------------------------------
    def _commit(
        self, decisions: list[Decision], vectors: np.ndarray, policy: str
    ) -> list[Decision]:
        writes = [
            Write(
                action=d.action,
                fact=d.fact,
                target_id=d.target_id,
                embedding=vectors[i],
                scores=d.scores(),
                policy=policy,
                inferred_key=d.inferred_key,
                memory_id=d.memory_id,
            )
            for i, d in enumerate(decisions)
        ]
        results = self.store.commit(writes)
        adds: dict[str, tuple[list[int], list[np.ndarray]]] = defaultdict(lambda: ([], []))
        removes: dict[str, list[int]] = defaultdict(list)
        out = []
        for i, (d, r) in enumerate(zip(decisions, results, strict=True)):
            ns = d.fact.namespace
            if r.replayed:
                out.append(
                    dc_replace(
                        d,
                        action=r.action,
                        target_id=r.target_id,
                        memory_id=r.memory_id,
                        review_id=r.review_id,
                        replayed=True,
                    )
                )
                continue
            if r.rowid is not None:
                adds[ns][0].append(r.rowid)
                adds[ns][1].append(vectors[i])
            if r.superseded_rowid is not None:
                removes[ns].append(r.superseded_rowid)
            out.append(dc_replace(d, memory_id=r.memory_id, review_id=r.review_id))
        for ns, (rowids, vecs) in adds.items():
            self.index.add(ns, np.asarray(rowids, dtype=np.int64), np.stack(vecs))
        for ns, rowids in removes.items():
            self.index.remove(ns, np.asarray(rowids, dtype=np.int64))
        return out


_NEGATION = re.compile(r"\b(?:no longer|not|never|anymore|any more)\b\s*|n't\b", re.IGNORECASE)


def _old_state(norm: Any) -> str | None:
    """The state a change fact says is over ("Ines no longer teaches" -> "Ines teaches")."""
    if not (norm.is_change and norm.negated and norm.old_value):
        return None
    clause = re.split(r"[;:]|, (?:and|but|so) ", norm.hypothesis)[0]
    stripped = " ".join(_NEGATION.sub("", clause).split())
    return stripped if stripped and stripped != clause else None


def _old_value_match(norm: Any, memory: str) -> keymod.Relation | None:
    """A change event names its old value ("from 23.8 to 24.3") and the memory holds it."""
    old = getattr(norm, "old_value", None)
    if not old or len(old) < 2:
        return None
    pattern = r"(?<![\w.])" + re.escape(old.strip()) + r"(?![\w]|\.\d)"
    found = re.search(pattern, memory, flags=re.IGNORECASE)
    return (
        keymod.Relation(key_match=True, key_conflict=False, reason="old_value") if found else None
    )


def _key_str(key: Any) -> str | None:
    return None if key is None else str(key)
