"""Artefact manifests: what a model directory holds, and the check that it still does.

Every artefact directory holds ``manifest.json`` next to its files. The runtime trusts nothing
that the manifest does not vouch for: each listed file's sha256 and size are checked before a
session is created, the model file must be listed, and label order, max length and pooling are
read from here, never from constants in code. Paths in a manifest are plain file names inside the
artefact directory; anything that escapes it (``..``, absolute paths, links out, a
``manifest.json`` that is itself a link out) is refused before it is opened.

The manifest seals itself: ``manifest_sha256`` is the sha256 of its canonical JSON without that
field, so a hand edit of labels, max length or a file hash is refused. (This is integrity, not
authenticity: whoever may rewrite the cache may also reseal it.) Manifests written before the seal
existed load with a warning; where the artefact ships a ``config.json`` (hashed like every file),
its label order and position table must agree with the manifest.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from engine.errors import ManifestMismatch, ModelError

__all__ = [
    "DIGEST_KEY",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "Manifest",
    "file_record",
    "load_manifest",
    "manifest_digest",
    "sha256_file",
    "write_manifest",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
DIGEST_KEY = "manifest_sha256"

log = logging.getLogger("memgate.runtime")

Task = Literal["embedding", "nli"]


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def file_record(path: Path) -> dict[str, Any]:
    return {"sha256": sha256_file(path), "size": path.stat().st_size}


@dataclass(frozen=True)
class Manifest:
    """The parsed manifest of one artefact directory."""

    directory: Path
    name: str
    task: Task
    variant: str
    """fp32, optimized, int8, fp16, or imported (an artefact taken as it was shipped)."""
    model_file: str
    tokenizer_file: str
    files: dict[str, dict[str, Any]]
    max_length: int
    static_length: int | None
    """Set when the graph only accepts inputs padded to exactly this length."""
    labels: tuple[str, ...] = ()
    pooling: str | None = None
    embedding_dim: int | None = None
    normalize: bool = True
    weights: Literal["pretrained", "random"] = "pretrained"
    opset: int | None = None
    inputs: tuple[str, ...] = ("input_ids", "attention_mask")
    outputs: tuple[str, ...] = ()
    source: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    """Everything else the builder recorded (parity, drift, versions); shown, never trusted."""

    @property
    def model_path(self) -> Path:
        return self.directory / self.model_file

    @property
    def tokenizer_path(self) -> Path:
        return self.directory / self.tokenizer_file

    def label_index(self, label: str) -> int | None:
        return self.labels.index(label) if label in self.labels else None

    def describe(self) -> str:
        src = self.source.get("id") or self.source.get("kind", "?")
        return f"{self.name}/{self.variant} ({self.task}, {self.weights} weights, from {src})"


def _inside(directory: Path, rel: str) -> Path:
    if not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
        raise ManifestMismatch(f"manifest names a file outside its directory: {rel!r}")
    path = (directory / rel).resolve()
    if directory.resolve() not in path.parents:
        raise ManifestMismatch(f"manifest file {rel!r} resolves outside {directory}")
    return path


def manifest_digest(body: Mapping[str, Any]) -> str:
    """The seal: sha256 of the manifest's canonical JSON, without the seal itself."""
    rest = {k: v for k, v in body.items() if k != DIGEST_KEY}
    canonical = json.dumps(rest, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


def load_manifest(directory: str | Path, *, verify: bool = True) -> Manifest:
    """Read ``directory/manifest.json``; with ``verify`` check its seal and every file's size
    and sha256."""
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    if path.is_symlink() or (path.exists() and path.resolve().parent != directory.resolve()):
        raise ManifestMismatch(
            f"{path} is a link: a manifest must be a plain file in its directory"
        )
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelError(
            f"no {MANIFEST_NAME} in {directory}: build it with `memgate models build`"
        ) from exc
    except (OSError, ValueError) as exc:
        raise ManifestMismatch(f"{path} is unreadable: {exc}") from exc
    if not isinstance(raw, dict) or raw.get("format") != FORMAT_VERSION:
        raise ManifestMismatch(
            f"{path}: unknown manifest format "
            f"{raw.get('format') if isinstance(raw, dict) else raw!r}"
        )
    try:
        manifest = Manifest(
            directory=directory,
            name=str(raw["name"]),
            task=raw["task"],
            variant=str(raw["variant"]),
            model_file=str(raw["model_file"]),
            tokenizer_file=str(raw["tokenizer_file"]),
            files={str(k): dict(v) for k, v in raw["files"].items()},
            max_length=int(raw["max_length"]),
            static_length=None if raw.get("static_length") is None else int(raw["static_length"]),
            labels=tuple(str(x) for x in raw.get("labels", ())),
            pooling=raw.get("pooling"),
            embedding_dim=raw.get("embedding_dim"),
            normalize=bool(raw.get("normalize", True)),
            weights=raw.get("weights", "pretrained"),
            opset=raw.get("opset"),
            inputs=tuple(raw.get("inputs", ("input_ids", "attention_mask"))),
            outputs=tuple(raw.get("outputs", ())),
            source=dict(raw.get("source", {})),
            extra={k: v for k, v in raw.items() if k not in _KNOWN and k != DIGEST_KEY},
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ManifestMismatch(f"{path}: malformed manifest ({exc!r})") from exc
    _check_consistency(manifest)
    if verify:
        for rel in manifest.files:  # where the files are, before what they hold
            _inside(manifest.directory, rel)
        _check_seal(raw, path)
        verify_files(manifest)
        _check_config(manifest)
    return manifest


def _check_seal(raw: Mapping[str, Any], path: Path) -> None:
    seal = raw.get(DIGEST_KEY)
    if seal is None:
        log.warning(
            "%s has no %s (written before manifests were sealed): edits to its labels or max "
            "length cannot be detected; rebuild it with `memgate models build --force`",
            path,
            DIGEST_KEY,
        )
        return
    if seal != manifest_digest(raw):
        raise ManifestMismatch(
            f"{path} was edited after it was written: its {DIGEST_KEY} does not match its "
            "content (labels, max length, file hashes...); rebuild the artefact"
        )


def _check_config(m: Manifest) -> None:
    """A hashed ``config.json`` (exported models ship one) must agree with the manifest."""
    if "config.json" not in m.files:
        return
    try:
        config = json.loads((m.directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ManifestMismatch(f"{m.directory}: config.json is unreadable: {exc}") from exc
    if not isinstance(config, dict):
        raise ManifestMismatch(f"{m.directory}: config.json is not a JSON object")
    id2label = config.get("id2label")
    if m.task == "nli" and isinstance(id2label, dict) and len(id2label) == len(m.labels):
        try:
            order = tuple(str(id2label[str(i)]).lower() for i in range(len(id2label)))
        except KeyError:
            order = ()
        if order and order != tuple(label.lower() for label in m.labels):
            raise ManifestMismatch(
                f"{m.directory}: manifest labels {m.labels} disagree with config.json {order}"
            )
    positions = config.get("max_position_embeddings")
    if (
        isinstance(positions, int)
        and not config.get("relative_attention")
        and m.max_length > positions
    ):
        raise ManifestMismatch(
            f"{m.directory}: max_length {m.max_length} exceeds the model's "
            f"{positions} positions (config.json)"
        )


_KNOWN = frozenset(
    "format name task variant model_file tokenizer_file files max_length static_length labels "
    "pooling embedding_dim normalize weights opset inputs outputs source".split()
)


def _check_consistency(m: Manifest) -> None:
    if m.task not in ("embedding", "nli"):
        raise ManifestMismatch(f"{m.directory}: unknown task {m.task!r}")
    for rel in (m.model_file, m.tokenizer_file):
        if rel not in m.files:
            raise ManifestMismatch(f"{m.directory}: {rel} is not covered by the manifest's hashes")
    if m.task == "nli":
        if len(m.labels) < 2 or "contradiction" not in m.labels:
            raise ManifestMismatch(
                f"{m.directory}: NLI labels must name 'contradiction', got {m.labels}"
            )
        if len(set(m.labels)) != len(m.labels):
            raise ManifestMismatch(f"{m.directory}: duplicate labels {m.labels}")
    if m.task == "embedding" and m.pooling not in ("mean", "cls"):
        raise ManifestMismatch(f"{m.directory}: unsupported pooling {m.pooling!r}")
    if m.max_length <= 0 or (m.static_length is not None and m.static_length != m.max_length):
        raise ManifestMismatch(f"{m.directory}: static_length must equal max_length")


def verify_files(m: Manifest) -> None:
    for rel, rec in m.files.items():
        path = _inside(m.directory, rel)
        if not path.is_file():
            raise ManifestMismatch(f"{m.directory}: {rel} is listed in the manifest but missing")
        if path.stat().st_size != rec.get("size"):
            raise ManifestMismatch(
                f"{m.directory}: {rel} has size {path.stat().st_size}, "
                f"manifest says {rec.get('size')}"
            )
        digest = sha256_file(path)
        if digest != rec.get("sha256"):
            raise ManifestMismatch(
                f"{m.directory}: {rel} sha256 {digest[:12]}… does not match the manifest"
            )


def write_manifest(directory: Path, fields: dict[str, Any], file_names: list[str]) -> Path:
    """Hash ``file_names`` inside ``directory`` and write the sealed manifest with ``fields``."""
    body = {"format": FORMAT_VERSION, **fields}
    body["files"] = {name: file_record(directory / name) for name in sorted(file_names)}
    body[DIGEST_KEY] = manifest_digest(body)
    path = directory / MANIFEST_NAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)
    load_manifest(directory)  # what we wrote must pass our own check
    return path
