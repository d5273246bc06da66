"""Item 14: expensive inputs.

A text at the model's max length (the embedder's ``max_length`` tokens, read from its manifest)
is the baseline. Texts at 2x, at the gate's character limit, and at 10x and 100x (capped at the
request byte limit) go through the real server with its default limits, in the same call shape
(a Triage in a namespace whose stored memory is a candidate, so embedding, search, NLI and the
lexical checks all run). Pass: each costs at most 1.5x the baseline (server-reported time minus
queueing, median of interleaved repetitions); texts over the limits are refused before any work.
Meanwhile a second tenant calls throughout from its own thread: 0 failures.

The runtime itself is held to the same bound with no limits at all: embedding a 10x or 100x text
costs what a max-length one does (``engine.runtime`` clips far-too-long texts at a word boundary
before tokenising, counts it, and the model sees the same tokens).
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from engine.server.codegen import ensure

ensure()

import grpc  # noqa: E402
from _tenants import ask, serve  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from engine.gate.gate import GateSettings  # noqa: E402
from engine.server.convert import Limits  # noqa: E402
from engine.server.proto import pb, pb_grpc  # noqa: E402

BOUND = 1.5
NOISE = 1.2
"""Timing noise allowance on a loaded 2-core box (interleaved medians still wobble ~10%)."""
REPEATS = 5
TOKENS = {"tok-heavy-0123456789abcdef": ["heavy/"], "tok-light-0123456789abcdef": ["light/"]}
HEAVY, LIGHT = TOKENS
PREMISE = "The customer's office is in Denver."
WORDS = (
    "the customer office moved from denver to chicago last spring and now works remotely on "
    "tuesdays with priya who manages billing shipping accounts invoices for the northern region"
).split()


def texts_by_tokens(tokenizer_path: str, max_length: int) -> dict[str, str]:
    """The baseline (exactly ``max_length`` tokens with [CLS] and [SEP]) and its multiples."""
    tok = Tokenizer.from_file(tokenizer_path)
    tok.no_truncation()
    rng = random.Random(8)
    words = ["The", "customer"]
    while len(tok.encode(" ".join(words)).ids) < max_length:
        words.append(rng.choice(WORDS))
    base = " ".join(words)
    assert len(tok.encode(base).ids) in (max_length, max_length + 1)
    return {
        "1x": base,
        "2x": " ".join([base] * 2),
        "10x": " ".join([base] * 10),
        "100x": " ".join([base] * 100),
    }


class Other:
    """The other tenant: calls until stopped, from its own thread and channel."""

    def __init__(self, target: str) -> None:
        self.channel = grpc.insecure_channel(target)
        self.stub = pb_grpc.MemgateStub(self.channel)
        self.ok = 0
        self.failures: list[str] = []
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            if i % 2:
                req: Any = pb.RecallRequest(namespace="light/a", query=b"Where is the office?", k=5)
                rpc = "Recall"
            else:
                fact = pb.Fact(namespace="light/a", text=f"Light tenant fact number {i}.".encode())
                req, rpc = pb.TriageRequest(facts=[fact]), "Triage"
            t0 = time.perf_counter()
            answer = ask(self.stub, rpc, req, LIGHT)
            self.latencies.append(time.perf_counter() - t0)
            if answer.code == "OK":
                self.ok += 1
            else:
                self.failures.append(f"{rpc}: {answer.code} {answer.details}")
            i += 1

    def __enter__(self) -> Other:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)
        self.channel.close()


def cost(stub: Any, text: str) -> tuple[str, float]:
    """(status, seconds): the server-reported time less queueing for an answer, the wall time
    for a refusal (which carries no timings)."""
    fact = pb.Fact(namespace="heavy/a", text=text.encode("utf-8")[: Limits().max_text_bytes + 1])
    t0 = time.perf_counter()
    answer = ask(stub, "Triage", pb.TriageRequest(facts=[fact]), HEAVY)
    wall = time.perf_counter() - t0
    if answer.code != "OK":
        return answer.code, wall
    timings = answer.responses[0].timings
    return answer.code, timings.total - timings.queue


def test_long_texts_cost_at_most_a_max_length_text(
    make_gate: Callable[..., Any], models: tuple[Any, Any], figures: Any
) -> None:
    embedder, nli = models
    texts = texts_by_tokens(str(embedder.manifest.tokenizer_path), embedder.manifest.max_length)
    chars_limit = GateSettings().max_text_chars
    texts["at char limit"] = texts["100x"][:chars_limit].rsplit(" ", 1)[0]
    gate = make_gate("expensive.db")
    st = serve(gate, TOKENS)
    channel = grpc.insecure_channel(st.target)
    stub = pb_grpc.MemgateStub(channel)
    try:
        # A stored memory like the texts: every call has a candidate (NLI and lexical checks).
        seed = pb.Fact(namespace="heavy/a", text=texts["1x"].encode())
        assert ask(stub, "Write", pb.WriteRequest(facts=[seed]), HEAVY).code == "OK"
        light = pb.Fact(namespace="light/a", text=b"The office of the light tenant is in Oslo.")
        assert ask(stub, "Write", pb.WriteRequest(facts=[light]), LIGHT).code == "OK"
        samples: dict[str, list[float]] = {name: [] for name in texts}
        codes: dict[str, str] = {}
        with Other(st.target) as other:
            for name in texts:  # warm each shape once
                cost(stub, texts[name])
            for _ in range(REPEATS):
                for name, text in texts.items():  # interleaved, so drift hits all alike
                    codes[name], seconds = cost(stub, text)
                    samples[name].append(seconds)
    finally:
        channel.close()
        st.stop(grace=0)
    median = {name: statistics.median(v) for name, v in samples.items()}
    ratio = {name: median[name] / median["1x"] for name in texts}
    figures.record(
        "14 expensive inputs",
        embedder_max_length=embedder.manifest.max_length,
        nli_max_length=nli.manifest.max_length,
        chars={name: len(t) for name, t in texts.items()},
        status=codes,
        median_s={k: round(v, 4) for k, v in median.items()},
        ratio={k: round(v, 3) for k, v in ratio.items()},
        bound=BOUND,
        noise_allowance=NOISE,
        other_tenant_ok=other.ok,
        other_tenant_failures=len(other.failures),
        other_tenant_p50_s=round(statistics.median(other.latencies), 4),
    )
    assert codes["1x"] == codes["2x"] == codes["at char limit"] == "OK"
    assert codes["10x"] == codes["100x"] == "INVALID_ARGUMENT"  # refused before any work
    assert not other.failures, other.failures[:5]
    assert other.ok >= REPEATS, "the other tenant made no progress"
    worst = max(ratio.values())
    assert worst <= BOUND * NOISE, ratio


def test_the_runtime_clips_far_too_long_texts(models: tuple[Any, Any], figures: Any) -> None:
    """No limits at all: embedding and scoring a 10x / 100x text cost what a max-length text
    costs, the tokens the model sees are the same, and the clipping is counted."""
    embedder, nli = models
    texts = texts_by_tokens(str(embedder.manifest.tokenizer_path), embedder.manifest.max_length)

    def timed(fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    shapes: dict[str, Callable[[str], Callable[[], Any]]] = {
        "embed": lambda t: lambda: embedder.embed([t]),
        "nli": lambda t: lambda: nli.score([(PREMISE, t)]),
    }
    ratios = {}
    for shape, make in shapes.items():
        runs: dict[str, list[float]] = {name: [] for name in ("1x", "10x", "100x")}
        for name in runs:
            make(texts[name])()  # warm
        for _ in range(REPEATS):
            for name in runs:
                runs[name].append(timed(make(texts[name])))
        base = statistics.median(runs["1x"])
        for name in ("10x", "100x"):
            ratios[f"{shape} {name}"] = round(statistics.median(runs[name]) / base, 3)

    # The same tokens, clipped or not; the clip is counted.
    for model, item, whole in (
        (embedder, texts["100x"], lambda t: embedder.tokenizer.encode(t)),
        (nli, (PREMISE, texts["100x"]), lambda p: nli.tokenizer.encode(*p)),
    ):
        clipped_before = model.totals.clipped
        prepared = model.preprocess([item])
        assert prepared.stats.clipped == 1 and prepared.stats.truncated == 1
        assert model.encode([item])[0].ids == whole(item).ids
        model.forward(prepared)
        assert model.totals.clipped == clipped_before + 1
    short = embedder.preprocess([texts["1x"]]).stats
    assert short.clipped == 0
    same, cases = same_tokens_when_clipped(embedder, nli)
    assert same == cases

    figures.record(
        "14 expensive inputs (runtime, no limits)",
        ratio=ratios,
        bound=BOUND,
        clipped_same_tokens=f"{same}/{cases}",
    )
    assert max(ratios.values()) <= BOUND * NOISE, ratios


def same_tokens_when_clipped(embedder: Any, nli: Any) -> tuple[int, int]:
    """Random long texts (blank runs, tabs, huge words, accents, CJK, emoji): the clipped
    encoding equals the whole text's encoding, for texts and for pairs."""
    rng = random.Random(11)
    vocab = [*WORDS, "naïve", "東京", "😀", "ünïcödé", "supercalifragilisticexpialidocious"]
    same = cases = 0
    for _ in range(40):
        sep = rng.choice([" ", "  ", "\n", " \t ", " " * 40])
        text = sep.join(rng.choice(vocab) for _ in range(rng.randint(300, 3000)))
        if rng.random() < 0.3:
            text = "x" * rng.randint(2000, 20000) + " " + text
        other = rng.choice(vocab) * rng.randint(1, 80)
        for model, item, whole in (
            (embedder, text, lambda t: embedder.tokenizer.encode(t)),
            (nli, (other, text), lambda p: nli.tokenizer.encode(*p)),
            (nli, (text, other), lambda p: nli.tokenizer.encode(*p)),
        ):
            cases += 1
            same += model.encode([item])[0].ids == whole(item).ids
    return same, cases


def test_raised_limits_are_measured(
    make_gate: Callable[..., Any], models: tuple[Any, Any], figures: Any
) -> None:
    """With the limits raised (1 MiB texts), 10x and 100x texts are accepted: their cost is
    recorded, and they must not fail anyone's calls. (The gate's lexical checks read the whole
    text, so the ratio at 100x is recorded, not bounded: see the report.)"""
    embedder, _ = models
    texts = texts_by_tokens(str(embedder.manifest.tokenizer_path), embedder.manifest.max_length)
    gate = make_gate("raised.db", settings=GateSettings(max_text_chars=1_000_000))
    st = serve(gate, TOKENS, limits=Limits(max_text_bytes=1 << 20))
    channel = grpc.insecure_channel(st.target)
    stub = pb_grpc.MemgateStub(channel)
    samples: dict[str, list[float]] = {"1x": [], "10x": [], "100x": []}
    try:
        seed = pb.Fact(namespace="heavy/a", text=texts["1x"].encode())
        assert ask(stub, "Write", pb.WriteRequest(facts=[seed]), HEAVY).code == "OK"
        with Other(st.target) as other:
            for _ in range(3):
                for name in samples:
                    fact = pb.Fact(namespace="heavy/a", text=texts[name].encode())
                    answer = ask(stub, "Triage", pb.TriageRequest(facts=[fact]), HEAVY)
                    assert answer.code == "OK", (name, answer.code, answer.details)
                    t = answer.responses[0].timings
                    samples[name].append(t.total - t.queue)
    finally:
        channel.close()
        st.stop(grace=0)
    base = statistics.median(samples["1x"])
    ratio = {k: round(statistics.median(v) / base, 3) for k, v in samples.items()}
    figures.record(
        "14 expensive inputs (raised limits, 1 MiB)",
        ratio=ratio,
        other_tenant_ok=other.ok,
        other_tenant_failures=len(other.failures),
    )
    assert not other.failures, other.failures[:5]
