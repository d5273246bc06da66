"""A Graphiti ``LLMClient`` whose edge invalidations are re-checked by memgate's gate.

::

    from graphiti_core import Graphiti
    from graphiti_core.llm_client import OpenAIClient
    from engine.adapters.graphiti import GatedLLMClient

    llm = GatedLLMClient.local(OpenAIClient())          # models from $MEMGATE_HOME
    graphiti = Graphiti(uri, user, password, llm_client=llm)
    await graphiti.add_episode(...)                     # "Alice moved to Austin."
    [(r.existing_fact, r.outcome) for r in llm.decisions]
    # [("Alice lives in Denver.", "kept"), ("Alice works at Acme.", "dropped")]

Graphiti resolves each new edge with one LLM call (prompt ``dedupe_edges.resolve_edge``,
response :class:`graphiti_core.prompts.dedupe_edges.EdgeDuplicate`): the prompt lists the
EXISTING FACTS (same endpoints) and the FACT INVALIDATION CANDIDATES with one continuous
``idx`` range, and every ``idx`` the LLM puts in ``contradicted_facts`` is expired. LLMs put
unrelated facts there (getzep/graphiti #1728: 41% of ~3,950 facts invalidated, most of them
collateral). This client passes every call to the wrapped client unchanged; for that one
response it decides the NEW FACT against the listed facts with the gate's own steps
(normalise, embed, relate, NLI with the listed fact as premise, weigh, the policy's rule and
the judge fitted for these models, as the gate's; no memgate store is read or written) and
keeps a contradiction only where the gate agrees:

======== ==========================================================================================
kept     the gate replaces exactly this fact (strict: the single most similar fact that clears
         the contradiction bars, not dominated, not ambiguous): Graphiti invalidates it
dropped  any other: removed from ``contradicted_facts``, the fact stays valid
review   the gate would queue it for review (``policy="review"``, or an ambiguous target under
         strict): removed, so Graphiti does not invalidate it; reported for a person to decide
======== ==========================================================================================

The client only removes contradictions; it never adds one the LLM did not make, and
``duplicate_facts`` passes through. Every contradiction the LLM made is recorded as an
:class:`Invalidation` with its scores: ``on_decision`` is called with each, and
``client.decisions`` holds the most recent ones. The facts are read from the prompt Graphiti
itself rendered (the two ``idx`` lists, as Graphiti writes them); a resolve_edge prompt without
them (a custom prompt library) is refused with :class:`~engine.errors.InvalidInput` before the
LLM is called. Extra: ``pip install 'memgate[graphiti]'``.
"""

from __future__ import annotations

import ast
import asyncio
import re
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from engine.adapters._common import missing_extra
from engine.adapters._engine import (
    LocalEngine,
    as_gate_engine,
    load_local_models,
    local_cache_dir,
)
from engine.errors import InvalidInput
from engine.gate.embed import embed
from engine.gate.gate import GateSettings, decide_recalled, policy_for, validate_fact
from engine.gate.judge import VerdictJudge
from engine.gate.judge.store import find_judge
from engine.gate.plan import plan
from engine.gate.policy import Policy, policy_by_name
from engine.gate.ports import NLI, Embedder
from engine.gate.probe import Hit, Ref
from engine.types import Decision, Fact

try:
    from graphiti_core.llm_client.client import LLMClient
    from graphiti_core.llm_client.config import ModelSize
    from graphiti_core.prompts.dedupe_edges import EdgeDuplicate
    from graphiti_core.prompts.models import Message
    from graphiti_core.tracer import Tracer
    from pydantic import ValidationError
except ImportError as exc:  # pragma: no cover - exercised by the missing-extra test
    raise missing_extra("graphiti", "graphiti-core") from exc

__all__ = ["GatedLLMClient", "GatedLLMSettings", "Invalidation", "judge"]

PROMPT = "dedupe_edges.resolve_edge"
"""Graphiti's edge-resolution prompt, whose ``contradicted_facts`` this client re-checks."""
_NAMESPACE = "graphiti"  # the facts are judged in memory only; the name is never stored
Outcome = Literal["kept", "dropped", "review"]


@dataclass(frozen=True)
class GatedLLMSettings:
    """How a :class:`GatedLLMClient` re-checks contradictions. Every field is checked."""

    policy: str = "strict"
    """The gate policy: ``strict`` (invalidate the one fact the gate would replace) or
    ``review`` (invalidate none; report them as ``review``), or any other of
    :data:`engine.gate.policy.POLICY_NAMES` (``seed``: the seed's plain rule)."""
    overrides: tuple[tuple[str, Any], ...] = ()
    """Policy settings overridden for every check, e.g. ``(("contradiction", 0.9),)``."""
    keep_decisions: int = 1000
    """How many of the most recent :class:`Invalidation` records ``decisions`` holds."""

    def __post_init__(self) -> None:
        policy_by_name(self.policy).with_overrides(dict(self.overrides))
        if not 1 <= self.keep_decisions <= 1_000_000:
            raise InvalidInput("keep_decisions must be in [1, 1000000]")


@dataclass(frozen=True)
class Invalidation:
    """One contradiction Graphiti's LLM made, and what the gate made of it."""

    idx: int
    """The fact's ``idx`` in the resolve_edge prompt."""
    existing_fact: str
    """The fact the LLM said is contradicted (the NLI premise)."""
    new_fact: str
    """The new edge's fact (the NLI hypothesis)."""
    outcome: Outcome
    reason: str
    """Why: the gate's rule when kept or review, else this fact's reason (``low_contradiction``,
    ``below_floor``, ``dominated_by:idx:0``, ``lost_to:idx:2`` (it passed, a closer fact won),
    ``not_reached:duplicate`` (the gate decided before reaching it) ...)."""
    similarity: float | None
    """Cosine similarity of the two facts (MiniLM); None when the gate did not reach the fact."""
    contradiction: float | None
    """P(contradiction) of (existing, new); None when the fact was below the similarity floor."""
    entailment: float | None
    decision: Decision
    """The gate's decision for the new fact against every listed fact (``target_id`` is
    ``idx:<n>``)."""


@dataclass(frozen=True)
class _Listing:
    """What the resolve_edge prompt showed the LLM."""

    new_fact: str
    facts: dict[int, str]
    """idx -> fact text, over both lists."""


class GatedLLMClient(LLMClient):
    """Every call goes to ``inner``; a resolve_edge response keeps only the contradictions the
    gate accepts (see the module). ``engine`` is an in-process ``engine.app.OpenedEngine``, its
    ``Gate`` or a :class:`~engine.adapters.LocalEngine`: the check needs the models in this
    process, so a remote ``MemgateClient`` is refused."""

    def __init__(
        self,
        inner: LLMClient,
        engine: Any,
        *,
        settings: GatedLLMSettings | None = None,
        on_decision: Callable[[Invalidation], None] | None = None,
    ) -> None:
        gate_engine = as_gate_engine(engine)
        if not isinstance(gate_engine, LocalEngine):
            raise InvalidInput(
                "GatedLLMClient scores facts with the NLI model in this process: pass an "
                "engine.app.OpenedEngine, a Gate or a LocalEngine (a remote MemgateClient cannot)"
            )
        gate = gate_engine.gate
        self._init(inner, gate.embedder, gate.nli, gate.settings, settings, on_decision, gate.judge)

    @classmethod
    def local(
        cls,
        inner: LLMClient,
        *,
        policy: str = "strict",
        cache_dir: str | Path | None = None,
        settings: GatedLLMSettings | None = None,
        on_decision: Callable[[Invalidation], None] | None = None,
    ) -> GatedLLMClient:
        """Load the default models of ``cache_dir`` (default ``$MEMGATE_HOME``, else
        ``~/.cache/memgate``); no memgate store is opened, nothing is written."""
        base = settings or GatedLLMSettings()
        settings = GatedLLMSettings(**{**base.__dict__, "policy": policy})
        embedder, nli = load_local_models(cache_dir)
        fitted = find_judge(local_cache_dir(cache_dir), embedder, nli)
        self = cls.__new__(cls)
        self._init(inner, embedder, nli, GateSettings(), settings, on_decision, fitted)
        return self

    def _init(
        self,
        inner: LLMClient,
        embedder: Embedder,
        nli: NLI,
        gate_settings: GateSettings,
        settings: GatedLLMSettings | None,
        on_decision: Callable[[Invalidation], None] | None,
        fitted: VerdictJudge | None = None,
    ) -> None:
        if not isinstance(inner, LLMClient):
            raise InvalidInput(
                f"inner must be a graphiti_core LLMClient, got {type(inner).__name__}"
            )
        super().__init__(inner.config, cache=False)  # the inner client caches, if it does
        self.inner = inner
        self.model, self.small_model = inner.model, inner.small_model
        self.temperature, self.max_tokens = inner.temperature, inner.max_tokens
        self.tracer = inner.tracer
        self.token_tracker = inner.token_tracker  # Graphiti reads usage off its llm_client
        self.embedder = embedder
        self.nli = nli
        self.gate_settings = gate_settings
        self.verdict_judge = fitted
        """The judge fitted for these models (the engine's, or the one ``local`` found in the
        cache), or None: the rule decides alone, as the gate does without one."""
        self.settings = settings or GatedLLMSettings()
        self.on_decision = on_decision
        self.decisions: deque[Invalidation] = deque(maxlen=self.settings.keep_decisions)
        """The most recent records, oldest first."""
        self._policy = policy_for(self.settings.policy, nli, embedder, fitted).with_overrides(
            dict(self.settings.overrides)
        )
        self._lock = threading.Lock()
        self._judging = threading.Lock()

    # -- LLMClient -------------------------------------------------------------------------
    def set_tracer(self, tracer: Tracer) -> None:
        super().set_tracer(tracer)
        self.inner.set_tracer(tracer)

    async def generate_response(
        self,
        messages: list[Message],
        response_model: Any = None,
        max_tokens: int | None = None,
        model_size: ModelSize = ModelSize.medium,
        group_id: str | None = None,
        prompt_name: str | None = None,
        *,
        attribute_extraction: bool = False,
        model: str | None = None,
    ) -> dict[str, Any]:
        gated = prompt_name == PROMPT or response_model is EdgeDuplicate
        # Read before the inner client appends its schema and cleans the text in place.
        listing = _listing(messages) if gated else None
        response: dict[str, Any] = await self.inner.generate_response(
            messages,
            response_model,
            max_tokens,
            model_size,
            group_id,
            prompt_name,
            attribute_extraction=attribute_extraction,
            model=model,
        )
        if listing is None:
            return response
        return await self._recheck(listing, response)

    async def _generate_response(
        self,
        messages: list[Message],
        response_model: Any = None,
        max_tokens: int = 0,
        model_size: ModelSize = ModelSize.medium,
        *,
        model: str | None = None,
    ) -> dict[str, Any]:
        """Only reached by callers of the base class's private retry path: go to ``inner``."""
        extra = {} if model is None else {"model": model}
        out: dict[str, Any] = await self.inner._generate_response(
            messages, response_model, max_tokens or self.max_tokens, model_size, **extra
        )
        return out

    # -- the check -------------------------------------------------------------------------
    def _judge(self, listing: _Listing) -> Decision:
        # One check at a time: Graphiti resolves edges concurrently, and the models' own
        # thread pools already use the cores (a second busy pool halves throughput).
        idxs = sorted(listing.facts)
        with self._judging:
            return judge(
                listing.new_fact,
                [listing.facts[i] for i in idxs],
                self.embedder,
                self.nli,
                self._policy,
                self.gate_settings,
                ids=[f"idx:{i}" for i in idxs],
                fitted=self.verdict_judge,
            )

    async def _recheck(self, listing: _Listing, response: Any) -> Any:
        """``response`` with only the contradictions the gate accepts (see the module)."""
        try:
            parsed = EdgeDuplicate(**response)
        except (TypeError, ValidationError):
            return response  # malformed: Graphiti raises its own error on it
        listed = [i for i in dict.fromkeys(parsed.contradicted_facts) if i in listing.facts]
        if not listed:
            return response  # nothing to check (out-of-range idx: Graphiti ignores them)
        decision = await asyncio.to_thread(self._judge, listing)
        records = [_record(i, listing, decision) for i in listed]
        kept = {r.idx for r in records if r.outcome == "kept"}
        with self._lock:
            self.decisions.extend(records)
        if self.on_decision is not None:
            for record in records:
                self.on_decision(record)
        out = dict(response)
        out["contradicted_facts"] = [
            i for i in parsed.contradicted_facts if i in kept or i not in listing.facts
        ]
        return out


def judge(
    text: str,
    facts: Sequence[str],
    embedder: Embedder,
    nli: NLI,
    policy: Policy,
    settings: GateSettings | None = None,
    *,
    ids: Sequence[str] | None = None,
    fitted: VerdictJudge | None = None,
) -> Decision:
    """The gate's decision for ``text`` against ``facts`` as the only memories: the steps of
    :meth:`engine.gate.gate.Gate.triage` (plan, embed, then :func:`decide_recalled`) with the
    facts in place of a recall, and no store. ``ids`` name the facts in the decision
    (default ``"0"``, ``"1"`` ...); like recall, the ``policy.top_k`` most similar are kept.
    ``fitted`` is the judge fitted for these models (its amendment, as the gate's), when the
    caller has one; ``policy`` should then carry its bars (:func:`policy_for` with it)."""
    if ids is None:
        ids = [str(i) for i in range(len(facts))]
    if len(ids) != len(facts):
        raise InvalidInput(f"{len(ids)} ids for {len(facts)} facts")
    settings = settings or GateSettings()
    fact = Fact(_NAMESPACE, text)
    validate_fact(fact, settings)
    [probe] = plan([fact], policy)
    embed([probe], embedder)
    assert probe.vector is not None
    if facts:
        vectors = embedder.embed(list(facts))
        sims = [float(probe.vector @ v) for v in vectors]
        order = sorted(range(len(facts)), key=lambda i: -sims[i])[: policy.top_k]
        probe.hits = [
            Hit(Ref(ids[i], facts[i], None), sims[i], rank) for rank, i in enumerate(order)
        ]
    [decision], _ = decide_recalled(
        [probe], embedder, nli, policy, lambda namespace, key: None, judge=fitted
    )
    return decision


def _record(idx: int, listing: _Listing, d: Decision) -> Invalidation:
    mid = f"idx:{idx}"
    cand = next((c for c in d.candidates if c.memory_id == mid), None)
    outcome: Outcome
    if d.target_id == mid and d.action in ("replace", "review"):
        outcome = "kept" if d.action == "replace" else "review"
        reason = d.rule
    elif cand is None:
        outcome, reason = "dropped", "not_recalled"
    elif cand.reason == "contradiction" and d.target_id is not None:
        outcome, reason = "dropped", f"lost_to:{d.target_id}"  # passed, another is closer
    elif cand.reason == "not_reached":
        outcome, reason = "dropped", f"not_reached:{d.rule}"  # decided before it (duplicate...)
    else:
        outcome, reason = "dropped", cand.reason
    return Invalidation(
        idx=idx,
        existing_fact=listing.facts[idx],
        new_fact=listing.new_fact,
        outcome=outcome,
        reason=reason,
        similarity=None if cand is None else cand.similarity,
        contradiction=None if cand is None else cand.contradiction,
        entailment=None if cand is None else cand.entailment,
        decision=d,
    )


_BLOCK = "<{0}>\\s*(.*?)\\s*</{0}>"


def _listing(messages: Sequence[Message]) -> _Listing:
    """The NEW FACT and the idx -> fact lists of a rendered resolve_edge prompt (Graphiti
    writes each list as the Python literal of ``[{"idx": int, "fact": str}, ...]``)."""
    user = next((m.content for m in messages if m.role == "user"), None)
    blocks = {}
    for name in ("EXISTING FACTS", "FACT INVALIDATION CANDIDATES", "NEW FACT"):
        found = None if user is None else re.search(_BLOCK.format(name), user, re.S)
        if found is None:
            raise InvalidInput(
                f"GatedLLMClient reads the facts of Graphiti's {PROMPT} prompt, and this one "
                f"has no <{name}> block (a custom prompt library or prompt overrides?)"
            )
        blocks[name] = found.group(1)
    facts: dict[int, str] = {}
    for name in ("EXISTING FACTS", "FACT INVALIDATION CANDIDATES"):
        for entry in _literal_list(blocks[name], name):
            facts[entry["idx"]] = entry["fact"]
    new_fact = blocks["NEW FACT"].strip()
    if not new_fact:
        raise InvalidInput(f"the {PROMPT} prompt has an empty NEW FACT")
    return _Listing(new_fact, facts)


def _literal_list(block: str, name: str) -> list[dict[str, Any]]:
    try:
        value = ast.literal_eval(block) if block.strip() else []
    except (SyntaxError, ValueError):
        value = None
    ok = isinstance(value, list) and all(
        isinstance(e, dict) and type(e.get("idx")) is int and isinstance(e.get("fact"), str)
        for e in value
    )
    if not ok:
        raise InvalidInput(
            f"the <{name}> block of the {PROMPT} prompt is not a list of {{'idx', 'fact'}} "
            f"entries: {block[:200]!r}"
        )
    return list(value)  # type: ignore[arg-type]
