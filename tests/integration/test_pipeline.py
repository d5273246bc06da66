"""The model pipeline end to end on tiny random models built offline in a module fixture.

export -> validate against PyTorch -> optimise -> quantise -> manifest -> load_manifest verifies,
plus the failure paths: parity outside atol, tampered files, traversal paths in a manifest, an
unreachable hub falling back (fast, and recorded), a missing export extra.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _tiny import DEBERTA_CONFIG, write_tokenizer

from engine.cli import models as cli
from engine.errors import InvalidInput, ManifestMismatch, ModelError
from engine.pipeline import checks, graph, sources
from engine.pipeline._common import require_export
from engine.pipeline.build import RandomInit, build_models, export_embedder, export_nli
from engine.runtime.layout import artefact_dir, build_lock, staging
from engine.runtime.manifest import load_manifest

pytestmark = pytest.mark.export

_WORDS = (
    "the user prefers green tea over coffee in morning my flight to lisbon leaves on friday at "
    "i moved and work a near is allergic peanuts lives berlin germany meeting thursday pm "
    "afternoon have dog named max cat costs here free text about walk along coast day of tide "
    "wind from north west cafe harbour that served grilled sardines note ends daughter s ok"
).split()


def _tiny_tokenizer(directory: Path) -> int:
    # Baked padding and truncation, as many hub tokenizers ship: the pipeline must clear both.
    return write_tokenizer(directory, _WORDS, baked_length=64)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny BertModel and a tiny DebertaV2ForSequenceClassification, saved like hub models."""
    import torch
    import transformers

    root = tmp_path_factory.mktemp("tiny-models")
    tok_dir = root / "tokenizer"
    vocab_size = _tiny_tokenizer(tok_dir)

    bert_dir = root / "tiny-bert"
    torch.manual_seed(0)
    bert = transformers.BertModel(
        transformers.BertConfig(
            vocab_size=vocab_size,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=128,
        )
    )
    bert.save_pretrained(bert_dir)
    shutil.copy(tok_dir / "tokenizer.json", bert_dir)

    nli_dir = root / "tiny-deberta"
    cfg = transformers.AutoConfig.for_model(**{**DEBERTA_CONFIG, "vocab_size": vocab_size})
    torch.manual_seed(0)
    transformers.DebertaV2ForSequenceClassification(cfg).save_pretrained(nli_dir)
    shutil.copy(tok_dir / "tokenizer.json", nli_dir)
    return {"bert": bert_dir, "nli": nli_dir, "tokenizer": tok_dir, "root": root}


@pytest.fixture(scope="module")
def built(tiny: dict[str, Path]) -> dict[str, Any]:
    """Every variant of both tiny models, built once into a cache directory."""
    cache = tiny["root"] / "cache"
    lines: list[str] = []
    embedder = export_embedder(tiny["bert"], cache / "models" / "tiny-bert", log=lines.append)
    nli = export_nli(tiny["nli"], cache / "models" / "tiny-nli", log=lines.append)
    return {"cache": cache, "embedder": embedder, "nli": nli, "log": lines}


def _copy_artefact(src: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "models" / src.parent.name / src.name
    shutil.copytree(src, dst)
    return dst


# --------------------------------------------------------------------------- happy path


def test_embedder_variants_are_built_and_verify(built: dict[str, Any]) -> None:
    dirs = built["embedder"]
    assert [d.name for d in dirs] == ["fp32", "optimized", "int8", "fp16"]
    for d in dirs:
        m = load_manifest(d)
        assert m.name == "tiny-bert" and m.task == "embedding" and m.variant == d.name
        assert m.pooling == "mean" and m.normalize and m.embedding_dim == 32
        assert m.max_length == 128  # capped by max_position_embeddings
        assert m.inputs == ("input_ids", "attention_mask", "token_type_ids")
        assert m.outputs == ("last_hidden_state",)
        assert isinstance(m.opset, int) and m.opset >= 14
        assert m.source["kind"] == "local" and m.source["revision"].startswith("sha256:")
        assert set(m.files) == {"model.onnx", "tokenizer.json", "config.json"}
        parity = m.extra["parity"]
        assert parity["reference"] == "pytorch" and parity["checked"] is True
        assert parity["max_abs_diff"] <= parity["atol"]
        assert {"memgate", "onnxruntime", "optimum", "transformers", "torch"} <= set(
            m.extra["builder"]
        )
        assert m.extra["created_at"].endswith("+00:00")


def test_fp32_and_optimized_match_pytorch_tightly(built: dict[str, Any]) -> None:
    for d in built["embedder"][:2]:
        parity = load_manifest(d).extra["parity"]
        assert parity["atol"] == 1e-4 and parity["max_abs_diff"] < 1e-4
        assert parity["min_cosine"] > 0.9999
    fused = load_manifest(built["embedder"][1]).extra["optimization"]["fused_operators"]
    assert fused.get("Attention", 0) == 2 and fused.get("SkipLayerNormalization", 0) >= 2


def test_int8_graph_is_quantised(built: dict[str, Any]) -> None:
    fp32 = graph.op_counts(built["embedder"][0] / "model.onnx")
    int8 = graph.op_counts(built["embedder"][2] / "model.onnx")
    int8_ops = int8.get("MatMulInteger", 0) + int8.get("DynamicQuantizeMatMul", 0)
    assert int8_ops > 0 and int8.get("QAttention", 0) == 2
    assert int8.get("MatMul", 0) < fp32.get("MatMul", 0)

    nli_fp32 = graph.op_counts(built["nli"][0] / "model.onnx")
    nli_int8 = graph.op_counts(built["nli"][1] / "model.onnx")
    # NLI int8 is rowwise: every constant-weight MatMul became a MatMulIntegerToFloat fed by a
    # per-row QuantizeLinear, nothing quantised per tensor
    fused = nli_int8.get("MatMulIntegerToFloat", 0)
    assert fused > 0 and nli_int8.get("QuantizeLinear", 0) == fused
    assert "DynamicQuantizeLinear" not in nli_int8 and "MatMulNBits" not in nli_int8
    assert nli_int8.get("MatMul", 0) + fused == nli_fp32.get("MatMul", 0)


def test_int8_manifest_records_isa_settings_and_drift(built: dict[str, Any]) -> None:
    m = load_manifest(built["embedder"][2])
    q = m.extra["quantization"]
    assert q["isa"] == graph.detect_isa()
    assert q["per_channel"] is True and q["weight_type"] == "QInt8"
    assert q["quantized_from"] == "optimized" and q["op_types"] == ["MatMul", "Attention"]
    drift = m.extra["drift_vs_fp32"]
    assert {"max_abs_diff", "cosine_mean", "cosine_min"} <= set(drift)
    assert -1.0 <= drift["cosine_min"] <= drift["cosine_mean"] <= 1.0

    nli = load_manifest(built["nli"][1])
    assert 0.0 <= nli.extra["drift_vs_fp32"]["argmax_agreement"] <= 1.0
    assert nli.extra["quantization"]["quantized_from"] == "fp32"


def test_int8_manifests_record_batch_invariance(built: dict[str, Any]) -> None:
    nli = load_manifest(built["nli"][1])
    q, inv = nli.extra["quantization"], nli.extra["batch_invariance"]
    assert q["method"] == "rowwise" and q["bits"] == 8 and "per row" in q["activations"]
    assert inv["invariant"] is True and inv["max_abs_diff"] <= inv["atol"] == 1e-4
    assert inv["batch"] == len(checks.PAIRS)
    # the embedder's int8 stays dynamic (per-tensor scales): measured, and found coupled
    emb = load_manifest(built["embedder"][2]).extra["batch_invariance"]
    assert emb["invariant"] is (emb["max_abs_diff"] <= 1e-4)


def test_rowwise_int8_is_row_invariant_and_near_fp32(built: dict[str, Any], tmp_path: Path) -> None:
    """The default route on the bare fp32 graph: per-row activation scales on the fused int8
    kernel, row-invariant, near fp32."""
    import numpy as np

    from engine.runtime.session import OrtModel, SessionSettings

    fp32, rowwise = built["nli"][0] / "model.onnx", tmp_path / "rw.onnx"
    settings = graph.rowwise_int8(fp32, rowwise)
    assert settings["weights_requantised"] > 0 and settings["method"] == "rowwise"
    ops = graph.op_counts(rowwise)
    assert ops.get("MatMulIntegerToFloat", 0) == settings["weights_requantised"]
    assert "DynamicQuantizeLinear" not in ops
    tok = built["nli"][0] / "tokenizer.json"
    got = {}
    for name, path in (("rw", rowwise), ("fp32", fp32)):
        model = OrtModel(path, SessionSettings(allow_spinning=False))
        run = lambda f, m=model: m.run(f)[0].astype(np.float64)  # noqa: E731
        inv = checks.batch_invariance(tok, checks.PAIRS, run, max_length=64, pad_id=0)
        assert inv["invariant"], (name, inv)
        got[name] = checks.gather(checks.encode(tok, checks.PAIRS, max_length=64, pad_id=0), run)
    assert np.abs(got["rw"] - got["fp32"]).max() < 0.05


@pytest.mark.parametrize("route", ["rowwise", "blockwise"])
def test_row_invariant_routes_keep_dynamic_int8_weights_exactly(
    built: dict[str, Any], tmp_path: Path, route: str
) -> None:
    """The aegis route on a tiny graph: dynamic int8 -> rowwise or blockwise keeps the int8
    weights (the dequantised fp32 graph is its reference), batches invariantly, and takes any
    length."""
    import numpy as np

    from engine.runtime.session import OrtModel, SessionSettings

    fp32 = built["nli"][0] / "model.onnx"
    dynamic, blockwise, reference = (tmp_path / f"{n}.onnx" for n in ("dyn", "nb8", "ref"))
    graph.quantize(fp32, dynamic)
    settings = graph.INT8_ROUTES[route](dynamic, blockwise, dynamic_length=True)
    assert settings["method"] == route
    graph.dequantize(dynamic, reference)
    assert settings["weights_kept_exact"] > 0 and settings["matmuls_left"] == 0
    assert settings["weights_requantised"] == 0
    ops = graph.op_counts(blockwise)
    assert "MatMulInteger" not in ops and "DynamicQuantizeLinear" not in ops

    tok = built["nli"][0] / "tokenizer.json"
    out = {}
    for name, path in (("nb8", blockwise), ("ref", reference), ("dyn", dynamic)):
        model = OrtModel(path, SessionSettings(allow_spinning=False))
        run = lambda f, m=model: m.run(f)[0].astype(np.float64)  # noqa: E731
        alone = checks.gather(
            checks.encode(tok, checks.PAIRS, max_length=64, pad_id=0, batch_size=1), run
        )
        inv = checks.batch_invariance(tok, checks.PAIRS, run, max_length=64, pad_id=0)
        out[name] = (alone, inv)
    # (the tiny model's logits are too small for the dynamic graph's coupling to show; the real
    # aegis graph's is asserted in tests/model/test_runtime.py)
    assert out["nb8"][1]["invariant"]
    assert out["nb8"][1]["max_abs_diff"] <= out["dyn"][1]["max_abs_diff"]
    # same weights, activations quantised per row (and block): near the fp32 reference
    assert np.abs(out["nb8"][0] - out["ref"][0]).max() < 0.05


def test_relative_position_buckets_never_reach_past_the_distance() -> None:
    """narrow_relative_span keeps the buckets within the padded length; that is only exact if
    transformers' log bucketing never maps a distance d further out than d."""
    import torch
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    for buckets, max_position in ((256, 512), (DEBERTA_CONFIG["position_buckets"], 128)):
        d = torch.arange(-4096, 4097)
        b = make_log_bucket_position(d, buckets, max_position)
        assert bool((b.abs() <= d.abs()).all()), (buckets, max_position)


def test_narrowed_relative_span_scores_exactly_as_the_export(
    tiny: dict[str, Path], built: dict[str, Any], tmp_path: Path
) -> None:
    """Every NLI variant is built from the narrowed graph (recorded in its manifest); against a
    fresh, un-narrowed export the logits are identical at lengths below, at and above the span
    (32 buckets), with padding; a graph without the pattern is written out unchanged."""
    import numpy as np
    import onnxruntime as ort
    import transformers
    from optimum.exporters.onnx import onnx_export_from_model

    from engine.pipeline import span

    for d in built["nli"]:
        relative = load_manifest(d).extra["export"]["relative_span"]
        assert relative == {**relative, "narrowed": 4, "left": 0, "span": 32}, d.name
    model = transformers.DebertaV2ForSequenceClassification.from_pretrained(tiny["nli"])
    with graph.quiet():
        onnx_export_from_model(model, tmp_path / "export", task="text-classification")
    plain, narrowed = tmp_path / "export" / "model.onnx", tmp_path / "narrowed.onnx"
    assert span.narrow_relative_span(plain, narrowed)["narrowed"] == 4
    # an already narrowed graph no longer matches: left as it is
    again = span.narrow_relative_span(narrowed, tmp_path / "again.onnx")
    assert again["narrowed"] == 0 and again["left"] == 4
    # benchmarks/bench_span.py's baseline: the narrowed graph widened back is the export again
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from bench_span import widen

    assert widen(narrowed, tmp_path / "wide.onnx") == 4
    assert graph.op_counts(tmp_path / "wide.onnx") == graph.op_counts(plain)
    paths = (plain, narrowed, tmp_path / "again.onnx", tmp_path / "wide.onnx")
    sessions = [ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in paths]
    rng = np.random.default_rng(0)
    for batch, length in ((1, 1), (3, 9), (2, 31), (2, 32), (3, 33), (2, 100), (1, 128)):
        ids = rng.integers(5, 60, (batch, length)).astype(np.int64)
        mask = np.ones_like(ids)
        mask[0, max(1, length // 2) :] = 0
        feeds = {"input_ids": ids, "attention_mask": mask}
        ref, *others = (s.run(None, feeds)[0] for s in sessions)
        for got in others:
            np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6, err_msg=f"{batch}x{length}")
    bert = built["embedder"][0] / "model.onnx"
    assert span.narrow_relative_span(bert, tmp_path / "bert.onnx")["narrowed"] == 0
    assert graph.op_counts(tmp_path / "bert.onnx") == graph.op_counts(bert)


def test_trimmed_nli_graphs_score_bit_identically(
    tiny: dict[str, Path], built: dict[str, Any], tmp_path: Path
) -> None:
    """The fp32 and int8 NLI variants are published trimmed (engine.pipeline.trim), with the
    check recorded; trim_graph on a fresh export (fp32, and its rowwise int8) removes every Tile
    and scores bit-identically at lengths below, at and above the span, with padding, in
    batches; a graph without the pattern is written out unchanged."""
    import numpy as np
    import onnxruntime as ort
    import transformers
    from optimum.exporters.onnx import onnx_export_from_model

    from engine.pipeline import span, trim
    from engine.pipeline._common import TRIM_ATOL

    for d in built["nli"]:
        record = load_manifest(d).extra.get("trim")
        if d.name == "fp16":
            assert record is None  # a CUDA graph: ONNX Runtime's CUDA fusions apply there
            continue
        assert record["applied"] is True and record["scales"] is False, d.name
        assert record["relative"] == 4 and record["relative_left"] == 0 and record["scale"] == 0
        assert record["max_abs_diff"] <= TRIM_ATOL and set(record["flips"].values()) == {0}
        assert (record["absmax"] > 0) is (d.name == "int8")
        assert "Tile" not in graph.op_counts(d / "model.onnx")
    model = transformers.DebertaV2ForSequenceClassification.from_pretrained(tiny["nli"])
    with graph.quiet():
        onnx_export_from_model(model, tmp_path / "export", task="text-classification")
    plain, narrowed = tmp_path / "export" / "model.onnx", tmp_path / "narrowed.onnx"
    span.narrow_relative_span(plain, narrowed)
    graph.rowwise_int8(narrowed, tmp_path / "int8.onnx")
    pairs = []
    for src in (plain, narrowed, tmp_path / "int8.onnx"):
        out = tmp_path / f"{src.stem}.trimmed.onnx"
        record = trim.trim_graph(src, out)
        assert record["relative"] == 4 and record["relative_transposes_folded"] == 2
        ops, before = graph.op_counts(out), graph.op_counts(src)
        assert "Tile" not in ops and before["Tile"] == 4
        # one index per distinct position tensor, not one per layer and term
        assert ops.get("Expand", 0) < before["Expand"]
        # every rowwise quantiser's ReduceMax(Abs(x)) is rewritten (the int8 graph has them)
        assert ops.get("Abs", 0) == before.get("Abs", 0) - record["absmax"]
        assert (record["absmax"] > 0) is (src.stem == "int8")
        pairs.append((src, out))
    rng = np.random.default_rng(0)
    for src, out in pairs:
        a, b = (
            ort.InferenceSession(str(p), providers=["CPUExecutionProvider"]) for p in (src, out)
        )
        for batch, length in ((1, 1), (3, 9), (2, 31), (2, 32), (3, 33), (2, 100), (1, 128)):
            ids = rng.integers(5, 60, (batch, length)).astype(np.int64)
            mask = np.ones_like(ids)
            mask[0, max(1, length // 2) :] = 0
            feeds = {"input_ids": ids, "attention_mask": mask}
            np.testing.assert_array_equal(
                b.run(None, feeds)[0], a.run(None, feeds)[0], err_msg=f"{src.stem} {batch}x{length}"
            )
    bert = built["embedder"][0] / "model.onnx"
    record = trim.trim_graph(bert, tmp_path / "bert.onnx")
    assert record["relative"] == record["absmax"] == record["scale"] == 0
    assert graph.op_counts(tmp_path / "bert.onnx") == graph.op_counts(bert)


def test_scale_folding_is_opt_in_and_moves_rounding_only(
    built: dict[str, Any], tmp_path: Path
) -> None:
    """trim_graph(scales=True) also moves the attention scale onto the products (FusedMatMul
    alpha, divisions on the relative-position rows): fp32 logits move by rounding only."""
    import numpy as np
    import onnxruntime as ort

    from engine.pipeline import trim

    fp32 = built["nli"][0] / "model.onnx"
    record = trim.trim_graph(fp32, tmp_path / "scaled.onnx", scales=True)
    # the published graph is trimmed already: only the QK^T scale is left to fold
    assert record["scale"] == 2 and record["relative"] == 0
    assert graph.op_counts(tmp_path / "scaled.onnx").get("FusedMatMul", 0) >= 2
    a, b = (
        ort.InferenceSession(str(p), providers=["CPUExecutionProvider"])
        for p in (fp32, tmp_path / "scaled.onnx")
    )
    ids = np.random.default_rng(1).integers(5, 60, (3, 40)).astype(np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    np.testing.assert_allclose(b.run(None, feeds)[0], a.run(None, feeds)[0], atol=1e-5, rtol=0)


def test_nli_variants_record_labels_and_skipped_optimisation(built: dict[str, Any]) -> None:
    assert [d.name for d in built["nli"]] == ["fp32", "int8", "fp16"]
    for d in built["nli"]:
        m = load_manifest(d)
        assert m.task == "nli" and m.labels == ("contradiction", "entailment", "neutral")
        assert m.inputs == ("input_ids", "attention_mask") and m.outputs == ("logits",)
        assert m.pooling is None and m.embedding_dim is None
        assert m.extra["optimization"]["skipped"] is True
        assert "disentangled attention" in m.extra["optimization"]["reason"]
    assert load_manifest(built["nli"][0]).extra["parity"]["atol"] == 1e-3


def test_fp16_keeps_fp32_io_and_is_checked_or_marked_unchecked(built: dict[str, Any]) -> None:
    m = load_manifest(built["embedder"][3])
    assert m.extra["fp16"]["keep_io_types"] is True
    parity = m.extra["parity"]
    assert parity["checked"] is False or parity["max_abs_diff"] <= parity["atol"]


def test_artefact_tokenizer_has_no_baked_padding(built: dict[str, Any]) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(built["embedder"][0] / "tokenizer.json"))
    assert tok.padding is None and tok.truncation is None
    assert load_manifest(built["embedder"][0]).extra["pad_id"] == 0


def test_progress_is_one_timed_line_per_step(built: dict[str, Any]) -> None:
    lines = built["log"]
    assert any(line.startswith("[tiny-bert] export to ONNX") for line in lines)
    assert any(line.startswith("[tiny-bert/int8] quantise") for line in lines)
    assert any(line.startswith("[tiny-nli/fp32] parity against PyTorch") for line in lines)
    steps = [line for line in lines if "source:" not in line]
    assert all(line.rstrip().endswith(" s)") for line in steps)


def test_no_scratch_directories_are_left(built: dict[str, Any]) -> None:
    leftovers = [p for p in (built["cache"] / "models").glob("*/*") if "." in p.name]
    assert leftovers == []


# --------------------------------------------------------------------------- rebuild policy


def test_up_to_date_artefacts_are_skipped_unless_forced(
    tiny: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "models" / "tiny-bert"
    export_embedder(tiny["bert"], out, variants=("fp32",), log=lambda _: None)
    before = (out / "fp32" / "model.onnx").stat().st_ino
    lines: list[str] = []
    export_embedder(tiny["bert"], out, variants=("fp32",), log=lines.append)
    assert any("up to date" in line for line in lines)
    assert (out / "fp32" / "model.onnx").stat().st_ino == before
    export_embedder(tiny["bert"], out, variants=("fp32",), force=True, log=lambda _: None)
    assert (out / "fp32" / "model.onnx").stat().st_ino != before
    load_manifest(out / "fp32")


def test_build_models_with_local_sources(tiny: dict[str, Path], tmp_path: Path) -> None:
    lines: list[str] = []
    dirs = build_models(
        tmp_path,
        source="offline",
        embedder=str(tiny["bert"]),
        nli=str(tiny["nli"]),
        variants=("fp32", "int8"),
        include_aegis=False,
        log=lines.append,
    )
    assert dirs == [
        artefact_dir(tmp_path, "minilm", "fp32"),
        artefact_dir(tmp_path, "minilm", "int8"),
        artefact_dir(tmp_path, "nli-deberta-v3-small", "fp32"),
        artefact_dir(tmp_path, "nli-deberta-v3-small", "int8"),
    ]
    assert not artefact_dir(tmp_path, "minilm", "optimized").exists()  # built, not published
    assert lines[-1].startswith("done: 4 artefacts")


def test_unknown_variant_or_source_is_refused(tiny: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(InvalidInput):
        build_models(tmp_path, variants=("int4",), log=lambda _: None)
    with pytest.raises(InvalidInput):
        build_models(tmp_path, source="somewhere", log=lambda _: None)
    with pytest.raises(InvalidInput):
        export_nli(tiny["nli"], tmp_path / "x", variants=("optimized",), log=lambda _: None)


# --------------------------------------------------------------------------- failure paths


def test_parity_failure_raises_and_publishes_nothing(tiny: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "models" / "tiny-bert"
    lines: list[str] = []
    with pytest.raises(ModelError, match="exceeds atol 0"):
        export_embedder(tiny["bert"], out, variants=("fp32",), atol={"fp32": 0.0}, log=lines.append)
    assert not (out / "fp32").exists()
    assert list(out.iterdir()) == []  # no scratch directory or half-written artefact left
    assert any("FAILED" in line for line in lines)


def test_tampered_file_fails_verification(built: dict[str, Any], tmp_path: Path) -> None:
    copy = _copy_artefact(built["embedder"][2], tmp_path)
    load_manifest(copy)
    tokenizer = copy / "tokenizer.json"
    data = bytearray(tokenizer.read_bytes())
    data[100] ^= 0x01
    tokenizer.write_bytes(bytes(data))
    with pytest.raises(ManifestMismatch):
        load_manifest(copy)
    assert cli.main(["models", "verify", "--cache-dir", str(tmp_path)]) == 1


def test_traversal_path_in_manifest_is_refused(built: dict[str, Any], tmp_path: Path) -> None:
    copy = _copy_artefact(built["nli"][0], tmp_path)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["files"]["../../escape.txt"] = {"sha256": "0" * 64, "size": 1}
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ManifestMismatch, match="outside"):
        load_manifest(copy)


def test_staging_failure_keeps_the_old_artefact(tmp_path: Path) -> None:
    final = tmp_path / "models" / "m" / "fp32"
    final.mkdir(parents=True)
    (final / "keep").write_text("old")
    with pytest.raises(RuntimeError), staging(final) as tmp:
        (tmp / "keep").write_text("new")
        raise RuntimeError("boom")
    assert (final / "keep").read_text() == "old"
    assert [p.name for p in final.parent.iterdir()] == ["fp32"]


def test_second_concurrent_build_is_refused(tmp_path: Path) -> None:
    with build_lock(tmp_path), pytest.raises(ModelError, match="another model build"):
        with build_lock(tmp_path):
            pass


def test_missing_export_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "optimum.exporters.onnx", None)
    with pytest.raises(ModelError, match=r"pip install 'memgate\[export\]'"):
        require_export()


# --------------------------------------------------------------------------- sources


def test_unreachable_hub_falls_back_fast_and_says_so(
    tiny: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    lines: list[str] = []
    start = time.perf_counter()
    dirs = export_embedder(
        "memgate-tests/no-such-embedder",
        tmp_path / "models" / "fallback",
        source="auto",
        fallback=tiny["bert"],
        variants=("fp32",),
        hub_timeout=3.0,
        log=lines.append,
    )
    assert time.perf_counter() - start < 10.0
    loud = [line for line in lines if line.startswith("!! hub unreachable (")]
    assert len(loud) == 1 and "using offline source" in loud[0]
    src = load_manifest(dirs[0]).source
    assert src["fallback"] is True and src["fallback_reason"]
    assert src["requested"] == "memgate-tests/no-such-embedder" and src["kind"] == "local"


def test_hub_only_mode_does_not_fall_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(ModelError, match="cannot fetch memgate-tests/no-such-model"):
        sources.resolve("memgate-tests/no-such-model", mode="hub", hub_timeout=3.0)
    assert time.perf_counter() - start < 10.0


def test_offline_mode_uses_a_random_init_stand_in(tiny: dict[str, Path], tmp_path: Path) -> None:
    lines: list[str] = []
    init = RandomInit(
        config=DEBERTA_CONFIG | {"vocab_size": 300},
        tokenizer=tiny["tokenizer"],
        stands_in_for="memgate-tests/tiny-nli",
    )
    dirs = export_nli(
        "memgate-tests/tiny-nli",
        tmp_path / "models" / "stand-in",
        source="offline",
        fallback=init,
        variants=("fp32",),
        log=lines.append,
    )
    assert any(line.startswith("!! offline mode") for line in lines)
    m = load_manifest(dirs[0])
    assert m.weights == "random"
    assert m.source["kind"] == "random-init" and m.source["seed"] == 0
    assert m.source["fallback"] is True and "offline" in m.source["fallback_reason"]
    assert m.labels == ("contradiction", "entailment", "neutral")


def test_local_path_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        sources.resolve(str(tmp_path / "missing"), mode="auto")


# --------------------------------------------------------------------------- small pure parts


def test_detect_isa_reads_cpu_flags() -> None:
    assert graph.detect_isa("flags\t: fpu avx2 avx512f avx512_vnni\n", "x86_64") == "avx512_vnni"
    assert graph.detect_isa("flags\t: fpu sse4_2 avx2\n", "x86_64") == "avx2"
    assert graph.detect_isa("", "aarch64") == "arm64"
    assert graph.detect_isa("flags\t: fpu sse4_2\n", "x86_64") == "generic"
    assert graph.quantization_settings("avx2")["reduce_range"] is True
    assert graph.quantization_settings("avx512_vnni")["reduce_range"] is False


def test_artefact_dir_refuses_path_segments(tmp_path: Path) -> None:
    assert artefact_dir(tmp_path, "minilm", "int8") == tmp_path / "models" / "minilm" / "int8"
    for bad in ("../x", "a/b", "", "int8.tmp-1"):
        with pytest.raises(InvalidInput):
            artefact_dir(tmp_path, "minilm", bad)


def test_default_cache_dir_honours_memgate_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMGATE_HOME", str(tmp_path))
    assert cli.default_cache_dir() == tmp_path
    monkeypatch.delenv("MEMGATE_HOME")
    assert cli.default_cache_dir() == Path.home() / ".cache" / "memgate"


def test_cli_list_and_verify(built: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", "list", "--cache-dir", str(built["cache"])]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["NAME", "VARIANT", "TASK"]
    assert len(table) == 1 + 7 and all(row.rstrip().endswith("yes") for row in table[1:])
    assert cli.main(["models", "verify", "--cache-dir", str(built["cache"])]) == 0
    assert "7/7 artefacts verify" in capsys.readouterr().out


def test_check_set_covers_non_ascii_and_overlong_inputs() -> None:
    assert any(not t.isascii() for t in checks.TEXTS)
    assert any(not (a + b).isascii() for a, b in checks.PAIRS)
    assert max(len(t.split()) for t in checks.TEXTS) > 512


def test_top_level_cache_dir_reaches_the_models_commands(
    built: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="memgate")
    parser.add_argument("--cache-dir", default="/nonexistent")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["--cache-dir", str(built["cache"]), "models", "verify"])
    assert args.func(args) == 0
    assert "7/7 artefacts verify" in capsys.readouterr().out


def test_public_names_resolve() -> None:
    from engine.pipeline import _common, aegis, build, static
    from engine.runtime import layout

    for module in (_common, aegis, build, checks, cli, graph, layout, sources, static):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


class _Info:
    def __init__(self, sha: str, files: list[str]) -> None:
        self.sha = sha
        self.siblings = [type("Sibling", (), {"rfilename": f})() for f in files]


def test_reachable_hub_records_the_commit(
    tiny: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    asked: dict[str, Any] = {}

    def snapshot_download(repo: str, **kwargs: Any) -> str:
        asked.update(kwargs, repo=repo)
        return str(tiny["bert"])

    monkeypatch.setattr(
        huggingface_hub, "model_info", lambda repo, **_: _Info("a" * 40, ["model.safetensors"])
    )
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    src = sources.resolve("memgate-tests/tiny-bert@main", mode="hub")
    assert src.kind == "hub" and src.revision == "a" * 40 and src.path == tiny["bert"]
    assert src.record == {"kind": "hub", "id": "memgate-tests/tiny-bert", "revision": "a" * 40}
    assert asked["repo"] == "memgate-tests/tiny-bert" and asked["revision"] == "a" * 40
    assert "*.safetensors" in asked["allow_patterns"] and "*.bin" not in asked["allow_patterns"]


def test_a_hanging_hub_times_out_and_falls_back(
    tiny: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "model_info", lambda *a, **k: time.sleep(5))
    lines: list[str] = []
    start = time.perf_counter()
    src = sources.resolve(
        "memgate-tests/slow", mode="auto", fallback=tiny["bert"], hub_timeout=0.2, log=lines.append
    )
    assert time.perf_counter() - start < 3.0
    assert src.fallback and src.record["fallback_reason"].startswith("TimeoutError")
    assert lines and lines[0].startswith("!! hub unreachable (TimeoutError")
