"""Tiny random-weight models for tests that need real ONNX sessions but not real weights.

One WordPiece tokenizer builder and one DeBERTa-v2 classifier config, shared by the pipeline
tests (tests/integration/test_pipeline.py) and the reliability suite's tiny model cache
(tests/reliability/_proc.py). Importable from any test: pytest puts ``tests/`` on sys.path.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CHARS = list("abcdefghijklmnopqrstuvwxyz0123456789.,:;!?'-_/")

DEBERTA_CONFIG: dict[str, Any] = {
    "model_type": "deberta-v2",
    "architectures": ["DebertaV2ForSequenceClassification"],
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 128,
    "relative_attention": True,
    "position_buckets": 32,
    "max_relative_positions": -1,
    "pos_att_type": ["p2c", "c2p"],
    "norm_rel_ebd": "layer_norm",
    "share_att_key": True,
    "position_biased_input": False,
    "type_vocab_size": 0,
    "pad_token_id": 0,
    "id2label": {"0": "contradiction", "1": "entailment", "2": "neutral"},
    "label2id": {"contradiction": 0, "entailment": 1, "neutral": 2},
}
"""A two-layer DebertaV2ForSequenceClassification with the NLI label order; add
``vocab_size``."""


def write_tokenizer(directory: Path, words: Sequence[str], *, baked_length: int = 0) -> int:
    """A WordPiece tokenizer over ``words`` plus single characters, saved as
    ``directory/tokenizer.json``; returns its vocabulary size. ``baked_length`` > 0 saves it with
    padding and truncation at that length turned on, as many hub tokenizers ship."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    pieces = SPECIAL + CHARS + [f"##{c}" for c in CHARS] + sorted(set(words))
    vocab = {p: i for i, p in enumerate(dict.fromkeys(pieces))}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
    )
    tok.decoder = decoders.WordPiece()
    if baked_length:
        tok.enable_padding(pad_id=0, pad_token="[PAD]", length=baked_length)
        tok.enable_truncation(baked_length)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    return len(vocab)
