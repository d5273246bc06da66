"""OpenVINO vs ONNX Runtime on the same ONNX graph, same process, interleaved rounds.

Runs in a separate virtualenv (openvino must not move the shared onnxruntime):

    python -m venv .venv-ov && .venv-ov/bin/pip install openvino==2026.4.1 onnxruntime==1.32.0 \\
        tokenizers numpy
    .venv-ov/bin/python benchmarks/openvino_probe.py GRAPH.onnx [GRAPH.onnx ...] \\
        --tokenizer DIR/tokenizer.json --pairs ../shared/eval/dev.jsonl

Prints pairs/s at batch 1 and 32 for each graph and runtime (median of rounds, min-max), the
OpenVINO / ONNX Runtime ratio per round, and the largest logit difference between the two.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np


def pairs_of(path: Path, n: int) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        case = json.loads(line)
        out += [(m["text"], case["incoming"]) for m in case["memories"]]
    return out[:n]


def compile_for(core: Any, path: Path, batch: int, args: argparse.Namespace) -> Any:
    """The graph compiled for the CPU plug-in, at ``[batch, static_length]`` when one is set."""
    model = core.read_model(str(path))
    if args.static_length:
        model.reshape({i.get_any_name(): [batch, args.static_length] for i in model.inputs})
    config = {"INFERENCE_NUM_THREADS": args.threads, "PERFORMANCE_HINT": "LATENCY"}
    return core.compile_model(model, "CPU", config)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("graphs", nargs="+", type=Path)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--pairs", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slice", type=float, default=2.0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--static-length",
        type=int,
        default=64,
        help="pad every batch to this length and compile OpenVINO for [batch, length] (its CPU "
        "plug-in refuses the DeBERTa export's If nodes at dynamic shape); 0: dynamic shapes",
    )
    args = parser.parse_args()

    import onnxruntime as ort
    import openvino as ov
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(args.tokenizer))
    tok.enable_truncation(args.static_length or 512)
    pairs = pairs_of(args.pairs, 256)
    pairs.sort(key=lambda p: len(tok.encode(*p).ids))  # length-sorted, as the engine batches

    def feeds(ps: list[tuple[str, str]]) -> dict[str, np.ndarray]:
        enc = tok.encode_batch(ps)
        width = args.static_length or max(len(e.ids) for e in enc)
        ids = np.zeros((len(ps), width), np.int64)
        mask = np.zeros_like(ids)
        for i, e in enumerate(enc):
            ids[i, : len(e.ids)] = e.ids
            mask[i, : len(e.ids)] = 1
        return {"input_ids": ids, "attention_mask": mask}

    core = ov.Core()
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model_name = next(
        (ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("Model name")),
        platform.processor(),
    )
    result: dict[str, Any] = {
        "cpu": model_name,
        "load_at_start": os.getloadavg(),
        "openvino": ov.__version__,
        "onnxruntime": ort.__version__,
        "ov_cpu_capabilities": core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"),
        "graphs": {},
    }
    print(f"{model_name}, load {os.getloadavg()}, openvino {ov.__version__}, ort {ort.__version__}")
    print(f"  OpenVINO CPU capabilities: {result['ov_cpu_capabilities']}")
    for path in args.graphs:
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = args.threads
        opts.inter_op_num_threads = 1
        sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        try:
            compiled = {b: compile_for(core, path, b, args) for b in (1, 8, 32)}
        except Exception as exc:  # openvino raises RuntimeError subclasses
            print(f"{path}: OpenVINO cannot compile it: {str(exc).splitlines()[0][:200]}")
            result["graphs"][str(path)] = {"openvino_error": str(exc)[:500]}
            continue
        requests = {b: c.create_infer_request() for b, c in compiled.items()}
        names = [i.get_any_name() for i in compiled[1].inputs]

        def run_ov(
            f: dict[str, np.ndarray], requests: Any = requests, names: list[str] = names
        ) -> np.ndarray:
            request = requests[f["input_ids"].shape[0]]
            return np.asarray(request.infer({n: f[n] for n in names})[0])

        def run_ort(f: dict[str, np.ndarray], sess: Any = sess) -> np.ndarray:
            return sess.run(None, f)[0]

        check = feeds(pairs[:8])
        diff = float(np.abs(run_ov(check) - run_ort(check)).max())
        engines = {"openvino": run_ov, "onnxruntime": run_ort}
        rates: dict[str, dict[int, list[float]]] = {e: {1: [], 32: []} for e in engines}
        for _ in range(args.rounds):
            for batch in (1, 32):
                chunks = [feeds(pairs[i : i + batch]) for i in range(0, len(pairs), batch)]
                for name, fn in engines.items():
                    fn(chunks[0])
                    n, i, t0 = 0, 0, time.perf_counter()
                    while time.perf_counter() - t0 < args.slice:
                        f = chunks[i % len(chunks)]
                        fn(f)
                        n += f["input_ids"].shape[0]
                        i += 1
                    rates[name][batch].append(n / (time.perf_counter() - t0))
        rec: dict[str, Any] = {"max_abs_logit_diff_ov_vs_ort": diff}
        print(f"\n{path} (max |logit OV - ORT| {diff:.2e})")
        for batch in (1, 32):
            ratio = [
                a / b
                for a, b in zip(rates["openvino"][batch], rates["onnxruntime"][batch], strict=True)
            ]
            rec[str(batch)] = {
                **{e: [round(r, 2) for r in rates[e][batch]] for e in engines},
                "ratio_median": statistics.median(ratio),
                "ratio_min": min(ratio),
                "ratio_max": max(ratio),
            }
            print(
                f"  batch {batch:>2}: OpenVINO {statistics.median(rates['openvino'][batch]):6.1f}"
                f"  ORT {statistics.median(rates['onnxruntime'][batch]):6.1f} pairs/s"
                f"  ratio {statistics.median(ratio):.2f}x [{min(ratio):.2f}-{max(ratio):.2f}]"
            )
        result["graphs"][str(path)] = rec
    result["load_at_end"] = os.getloadavg()
    print(f"\nload at end {os.getloadavg()}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
