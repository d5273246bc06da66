"""Check a write-gate case file: structure, `[trap]` lookalikes, and summary counts.

A `[trap]` case (notes start with "[trap]") is valid only if a wrong memory is strictly the
lexically closest one to the incoming fact under a stop-worded bag-of-words cosine: lower-case,
tokens of letters and digits, a modest English stop-word list, cosine of term counts. "Wrong"
means any memory other than the expected target (for add cases every memory is wrong).

Standard library only. Usage:

    python3 benchmarks/data/check_traps.py benchmarks/data/heldout2.jsonl [--stats] [--verbose]

Exit status 1 when a structural check or a trap check fails.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import re
import sys

STOP_WORDS = frozenset(
    """a an the and or but nor so if then than that this these those of to in on at by for from
    with without into onto over under about as is are was were be been being am has have had do
    does did it its it's i me my mine we us our ours you your yours he him his she her hers they
    them their theirs s t d ll m re ve not no now just also very too there here what which who
    whom when where why how all any both each few more most other some such only own same can
    will would should could may might must shall up down out off again once per via""".split()
)
ACTIONS = ("replace", "add", "skip", "review")


def tokens(text: str) -> list[str]:
    """Lower-case letter/digit tokens with stop words removed."""
    return [t for t in re.findall(r"[a-z0-9]+", text.lower()) if t not in STOP_WORDS]


def cosine(a: str, b: str) -> float:
    """Cosine similarity of the two texts' term-count vectors (0.0 when either is empty)."""
    ca, cb = collections.Counter(tokens(a)), collections.Counter(tokens(b))
    dot = sum(n * cb[t] for t, n in ca.items())
    na = math.sqrt(sum(n * n for n in ca.values()))
    nb = math.sqrt(sum(n * n for n in cb.values()))
    return dot / (na * nb) if na and nb else 0.0


def structure_errors(cases: list[dict]) -> list[str]:
    """Unique case ids, m1..mN memory ids, 3-12 memories, valid actions and targets."""
    errs, seen = [], set()
    for c in cases:
        cid = c["id"]
        if cid in seen:
            errs.append(f"{cid}: duplicate case id")
        seen.add(cid)
        mids = [m["id"] for m in c["memories"]]
        if mids != [f"m{k}" for k in range(1, len(mids) + 1)]:
            errs.append(f"{cid}: memory ids are not m1..mN")
        if not 3 <= len(mids) <= 12:
            errs.append(f"{cid}: {len(mids)} memories")
        act, tgt = c["expected"]["action"], c["expected"]["target"]
        if act not in ACTIONS:
            errs.append(f"{cid}: bad action {act!r}")
        if act == "add" and tgt is not None:
            errs.append(f"{cid}: add must have target null")
        if act in ("replace", "skip") and tgt is None:
            errs.append(f"{cid}: {act} needs a target")
        if tgt is not None and tgt not in mids:
            errs.append(f"{cid}: target {tgt} is not a memory")
        if not c.get("notes"):
            errs.append(f"{cid}: empty notes")
    return errs


def trap_errors(cases: list[dict], verbose: bool = False) -> tuple[int, list[str]]:
    """Check every `[trap]` case; return (trap count, errors)."""
    errs, n = [], 0
    for c in cases:
        if not c.get("notes", "").startswith("[trap]"):
            continue
        n += 1
        cid, tgt = c["id"], c["expected"]["target"]
        if c["category"] != "lookalike":
            errs.append(f"{cid}: [trap] outside lookalike")
        if c["expected"]["action"] not in ("replace", "add"):
            errs.append(f"{cid}: [trap] must be replace or add")
        sims = sorted(
            ((cosine(c["incoming"], m["text"]), m["id"]) for m in c["memories"]), reverse=True
        )
        (top, top_id), (second, _) = sims[0], sims[1]
        if verbose:
            print(cid, " ".join(f"{i}={s:.3f}" for s, i in sims), "target", tgt)
        if top_id == tgt:
            errs.append(f"{cid}: the target {tgt} is the closest memory ({top:.3f})")
        elif top <= 0.0:
            errs.append(f"{cid}: no memory shares a word with the incoming fact")
        elif top <= second:
            errs.append(f"{cid}: closest memory is tied ({top:.3f})")
    return n, errs


def stats(cases: list[dict]) -> None:
    """Print the category x action table, review share and store sizes (Markdown)."""
    table = collections.defaultdict(collections.Counter)
    for c in cases:
        table[c["category"]][c["expected"]["action"]] += 1
    print("| category | total | " + " | ".join(ACTIONS) + " |")
    print("|---|---:|" + "---:|" * len(ACTIONS))
    total = collections.Counter()
    for cat, row in table.items():
        total.update(row)
        cells = " | ".join(str(row[a]) if row[a] else "" for a in ACTIONS)
        print(f"| {cat} | {sum(row.values())} | {cells} |")
    cells = " | ".join(f"**{total[a]}**" for a in ACTIONS)
    print(f"| **all** | **{sum(total.values())}** | {cells} |")
    reviews = [c for c in cases if c["expected"]["action"] == "review"]
    nulls = sum(c["expected"]["target"] is None for c in reviews)
    print(f"review: {len(reviews)} ({len(reviews) / len(cases):.1%}), {nulls} with target null")
    sizes = collections.Counter(len(c["memories"]) for c in cases)
    print("store sizes:", ", ".join(f"{k}: {sizes[k]}" for k in sorted(sizes)))
    lengths = [len(c["incoming"].split()) for c in cases]
    print(f"incoming length: {min(lengths)}-{max(lengths)} words")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path")
    ap.add_argument("--stats", action="store_true", help="print counts tables")
    ap.add_argument("--verbose", action="store_true", help="print each trap's cosines")
    args = ap.parse_args(argv)
    with open(args.path, encoding="utf-8") as f:
        cases = [json.loads(line) for line in f if line.strip()]
    errs = structure_errors(cases)
    n_traps, terrs = trap_errors(cases, args.verbose)
    errs += terrs
    for e in errs:
        print("ERROR", e)
    if args.stats:
        stats(cases)
    print(f"{len(cases)} cases, {n_traps} [trap] cases, {len(errs)} errors")
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
