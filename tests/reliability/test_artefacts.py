"""Item 16: model paths and files.

Every case is a model cache of its own (hard links to the installed MiniLM fp32 and aegis NLI
artefacts, with freshly sealed manifests), broken in one way: traversal in a model name or
variant, absolute paths, links out of the cache (an artefact directory, a model directory, a
file, the manifest itself), manifest entries naming files outside the artefact directory, and
tampered artefacts (model bytes, tokenizer, a manifest hash, labels, max length, static length,
a missing or truncated file). Each must be refused at start (``load_models``, what ``memgate
serve`` runs) with an error that says what is wrong; an intact copy must load (the control).

All cases run in one subprocess, under ``strace -f -e trace=openat,open,creat`` when strace is
there, and always with a Python audit hook on ``open``/``os.listdir``/``os.scandir``: every path
opened must lie inside the case caches, the Python installation, the repository's ``engine``
package, or (native opens only) the system's libraries and ``/proc``, ``/sys``, ``/dev``. The
decoy artefacts outside the caches, the links point to, are never opened.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.runtime.manifest import DIGEST_KEY, MANIFEST_NAME, load_manifest, manifest_digest

ROOT = Path(__file__).resolve().parents[2]
ARTEFACTS = (("minilm", "fp32"), ("aegis-nli", "imported"))
SYSTEM_ROOTS = (
    "/etc/ld.so.cache",
    "/lib",
    "/lib64",
    "/usr/lib",
    "/usr/lib64",
    "/proc",
    "/sys",
    "/dev",
)
"""Where native code (the dynamic loader, ONNX Runtime's CPU probing) may open files."""
SYSTEM_FILES = (
    "/etc/ld.so.cache",  # the dynamic loader
    "/etc/localtime",  # libc, for local time
    "/usr/share/locale/locale.alias",  # libc / python locale setup
    "/etc/os-release",  # onnxruntime's import-time distribution check
)
"""Single files any process of this stack reads at start, whatever the model paths."""


# -- building caches ------------------------------------------------------------------------------
def _link_artefact(src: Path, dst: Path) -> None:
    """``dst`` holds hard links to ``src``'s listed files and a copy of its manifest, resealed
    (the installed manifests may predate the seal)."""
    dst.mkdir(parents=True)
    raw = json.loads((src / MANIFEST_NAME).read_text("utf-8"))
    for name in raw["files"]:
        try:
            os.link(src / name, dst / name)
        except OSError:  # another filesystem: copy (only the template comes from the cache)
            shutil.copyfile(src / name, dst / name)
    raw[DIGEST_KEY] = manifest_digest(raw)
    (dst / MANIFEST_NAME).write_text(json.dumps(raw, indent=2, sort_keys=True), "utf-8")


def _edit_manifest(directory: Path, edit: Callable[[dict[str, Any]], None], reseal: bool) -> None:
    path = directory / MANIFEST_NAME
    raw = json.loads(path.read_text("utf-8"))
    edit(raw)
    if reseal:
        raw[DIGEST_KEY] = manifest_digest(raw)
    path.unlink()  # a new file: never write through a hard link into the real cache
    path.write_text(json.dumps(raw, indent=2, sort_keys=True), "utf-8")


def _replace(path: Path, data: bytes) -> None:
    path.unlink()  # the old name was a hard link to the installed artefact: leave that alone
    path.write_bytes(data)


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    _replace(path, bytes(data))


def _retokenize(path: Path) -> None:
    text = path.read_text("utf-8")
    changed = (
        text.replace('"[UNK]"', '"[UNX]"', 1) if '"[UNK]"' in text else text.replace("a", "b", 1)
    )
    assert changed != text and len(changed) == len(text)
    _replace(path, changed.encode("utf-8"))


def _relink(path: Path, target: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    path.symlink_to(target)


class Case:
    def __init__(
        self,
        name: str,
        expect: str,
        break_: Callable[[Path, Path], None] | None = None,
        choice: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.expect = expect
        """A fragment the error must contain (a regex), or "" for the control that loads."""
        self.break_ = break_
        self.choice = choice or {}


def emb(cache: Path) -> Path:
    return cache / "models" / "minilm" / "fp32"


def nli(cache: Path) -> Path:
    return cache / "models" / "aegis-nli" / "imported"


def _outside_file(cache: Path, decoy: Path, rel: str, absolute: bool = False) -> None:
    """The manifest names a file outside its directory, with that file's true hash, resealed."""

    def edit(raw: dict[str, Any]) -> None:
        target = str(decoy / "minilm" / "fp32" / "tokenizer.json") if absolute else rel
        raw["files"][target] = raw["files"].pop("tokenizer.json")
        raw["tokenizer_file"] = target

    _edit_manifest(emb(cache), edit, reseal=True)


CASES = [
    Case("intact copy (control)", ""),
    Case("--nli ../../etc", "plain name", choice={"nli": "../../etc"}),
    Case("--nli /etc (absolute)", "plain name", choice={"nli": "/etc"}),
    Case("--nli-variant ..", "plain name", choice={"nli": "aegis-nli", "nli_variant": ".."}),
    Case("--embedder-variant with /", "plain name", choice={"embedder_variant": "fp32/../../x"}),
    Case(
        "artefact directory links out of the cache",
        "outside the model cache",
        lambda c, d: _relink(emb(c), d / "minilm" / "fp32"),
    ),
    Case(
        "model directory links out of the cache",
        "outside the model cache",
        lambda c, d: _relink(nli(c).parent, d / "aegis-nli"),
    ),
    Case(
        "file links out of its directory",
        "outside",
        lambda c, d: _relink(emb(c) / "tokenizer.json", d / "minilm" / "fp32" / "tokenizer.json"),
    ),
    Case(
        "manifest is a link out",
        "is a link",
        lambda c, d: _relink(emb(c) / MANIFEST_NAME, d / "minilm" / "fp32" / MANIFEST_NAME),
    ),
    Case(
        "manifest names ../ files (resealed)",
        "outside its directory",
        lambda c, d: _outside_file(c, d, "../../../../../decoy/minilm/fp32/tokenizer.json"),
    ),
    Case(
        "manifest names an absolute file (resealed)",
        "outside its directory",
        lambda c, d: _outside_file(c, d, "", absolute=True),
    ),
    Case(
        "model bytes changed", "model.onnx sha256", lambda c, d: _flip_byte(emb(c) / "model.onnx")
    ),
    Case(
        "tokenizer changed",
        "tokenizer.json sha256",
        lambda c, d: _retokenize(emb(c) / "tokenizer.json"),
    ),
    Case(
        "model truncated",
        "model.onnx has size",
        lambda c, d: _replace(emb(c) / "model.onnx", (emb(c) / "model.onnx").read_bytes()[:-4096]),
    ),
    Case(
        "file missing",
        "listed in the manifest but missing",
        lambda c, d: (nli(c) / "tokenizer.json").unlink(),
    ),
    Case(
        "manifest hash changed",
        "edited after it was written",
        lambda c, d: _edit_manifest(
            emb(c), lambda r: r["files"]["model.onnx"].update(sha256="0" * 64), reseal=False
        ),
    ),
    Case(
        "manifest hash changed (resealed)",
        "model.onnx sha256",
        lambda c, d: _edit_manifest(
            emb(c), lambda r: r["files"]["model.onnx"].update(sha256="0" * 64), reseal=True
        ),
    ),
    Case(
        "labels swapped",
        "edited after it was written",
        lambda c, d: _edit_manifest(nli(c), lambda r: r["labels"].reverse(), reseal=False),
    ),
    Case(
        "max length changed",
        "edited after it was written",
        lambda c, d: _edit_manifest(emb(c), lambda r: r.update(max_length=4096), reseal=False),
    ),
    Case(
        "max length beyond the positions (resealed)",
        "exceeds the model's 512 positions",
        lambda c, d: _edit_manifest(emb(c), lambda r: r.update(max_length=4096), reseal=True),
    ),
    Case(
        "static length changed (resealed)",
        "width 160",
        lambda c, d: _edit_manifest(
            nli(c), lambda r: r.update(max_length=192, static_length=192), reseal=True
        ),
    ),
    Case(
        "max length the graph cannot take, no config.json (resealed)",
        "does not take inputs",
        lambda c, d: (
            (emb(c) / "config.json").unlink(),
            _edit_manifest(
                emb(c),
                lambda r: (r["files"].pop("config.json"), r.update(max_length=600)),
                reseal=True,
            ),
        ),
    ),
]

CHILD = r"""
import json, sys
events = []
recording = [True]

def hook(event, args):
    if not recording[0]:
        return
    if event == "open" and isinstance(args[0], (str, bytes)):
        path = args[0] if isinstance(args[0], str) else args[0].decode("utf-8", "replace")
        events.append(("open", path))
    elif event in ("os.listdir", "os.scandir") and isinstance(args[0], (str, bytes)):
        events.append((event, str(args[0])))

sys.addaudithook(hook)
from pathlib import Path
from engine.errors import MemgateError
from engine.runtime.loader import ModelChoice, load_models
from engine.runtime.session import SessionSettings

plan = json.loads(sys.argv[1])
results = []
for case in plan["cases"]:
    try:
        embedder, nli = load_models(
            Path(case["cache"]), ModelChoice(**case["choice"]), SessionSettings(intra_op_threads=1)
        )
        results.append({"name": case["name"], "ok": True, "labels": list(nli.labels)})
    except MemgateError as exc:
        error = {"error": type(exc).__name__, "message": str(exc)}
        results.append({"name": case["name"], "ok": False, **error})
recording[0] = False  # the report below is the harness's own file
Path(plan["out"]).write_text(json.dumps({"results": results, "events": events}))
"""


@pytest.fixture(scope="module")
def caches(cache_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the directory of every case cache, the decoy directory outside them, a template)."""
    base = tmp_path_factory.mktemp("artefacts")
    template = base / "template"
    for name, variant in ARTEFACTS:
        _link_artefact(cache_dir / "models" / name / variant, template / "models" / name / variant)
        load_manifest(template / "models" / name / variant)  # the resealed copy verifies
    decoy = base / "decoy"
    for name, variant in ARTEFACTS:
        _link_artefact(template / "models" / name / variant, decoy / name / variant)
    return base / "caches", decoy, template


def _copy_cache(template: Path, dst: Path) -> None:
    for name, variant in ARTEFACTS:
        _link_artefact(template / "models" / name / variant, dst / "models" / name / variant)


def _trace_opens(trace: Path, cwd: Path) -> list[str]:
    paths = []
    pattern = re.compile(
        r'^\d+\s+(?:openat|open|creat)\((?:AT_FDCWD, |(\d+), )?"((?:[^"\\]|\\.)*)"'
    )
    for line in trace.read_text(errors="replace").splitlines():
        m = pattern.match(line)
        if m is None:
            continue
        dirfd, path = m.groups()
        if dirfd is not None and not path.startswith("/"):
            path = f"<fd {dirfd}>/{path}"
        paths.append(path if path.startswith(("/", "<")) else str(cwd / path))
    return paths


def _outside(path: str, roots: list[str]) -> bool:
    real = os.path.normpath(path)
    return not any(real == r or real.startswith(r.rstrip("/") + "/") for r in roots)


def test_traversal_and_tampered_artefacts_are_refused(
    caches: tuple[Path, Path, Path], figures: Any, tmp_path: Path
) -> None:
    root, decoy, template = caches
    plan_cases = []
    for i, case in enumerate(CASES):
        cache = root / f"case{i:02d}"
        _copy_cache(template, cache)
        if case.break_ is not None:
            case.break_(cache, decoy)
        plan_cases.append({"name": case.name, "cache": str(cache), "choice": case.choice})
    out = tmp_path / "results.json"
    plan = json.dumps({"cases": plan_cases, "out": str(out)})
    cmd = [sys.executable, "-c", CHILD, plan]
    strace = shutil.which("strace")
    trace = tmp_path / "strace.txt"
    if strace:
        cmd = [strace, "-f", "-qq", "-e", "trace=openat,open,creat", "-o", str(trace), *cmd]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # The engine must opt out of ONNX Runtime's telemetry itself (it writes a device id and an
    # event cache under ~/.cache/Microsoft): do not inherit this process's opt-out.
    env.pop("ORT_DISABLE_TELEMETRY", None)
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    results = {r["name"]: r for r in report["results"]}

    refused, problems = 0, []
    for case in CASES:
        r = results[case.name]
        if not case.expect:
            if not r["ok"]:
                problems.append(f"{case.name}: the intact copy was refused: {r['message']}")
            continue
        if r["ok"]:
            problems.append(f"{case.name}: LOADED")
        elif not re.search(case.expect, r["message"]):
            problems.append(f"{case.name}: unclear error {r['error']}: {r['message']}")
        else:
            refused += 1

    py_roots = sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
    allowed = [str(root), *(os.path.realpath(p) for p in py_roots), *py_roots, str(ROOT / "engine")]
    # Exactly these, not what is under them: the import path's directories (listed, not
    # descended into) and the harness's own report file.
    exact = {str(ROOT), str(tmp_path), str(out), *SYSTEM_FILES}
    python_level = [p for _, p in report["events"]]
    py_outside = sorted({p for p in python_level if p not in exact and _outside(p, allowed)})
    native = _trace_opens(trace, tmp_path) if strace else []
    native_outside = sorted(
        {p for p in native if p not in exact and _outside(p, [*allowed, *SYSTEM_ROOTS])}
    )
    decoy_opens = [p for p in [*python_level, *native] if not _outside(p, [str(decoy)])]
    figures.record(
        "16 model paths and files",
        cases=len(CASES) - 1,
        refused_with_clear_error=refused,
        control_loads=results[CASES[0].name]["ok"],
        python_opens=len(python_level),
        native_opens=len(native) if strace else "strace unavailable",
        opened_outside_allowed_roots=len(py_outside) + len(native_outside),
        decoy_opens=len(decoy_opens),
    )
    assert not problems, "\n".join(problems)
    assert refused == len(CASES) - 1 >= 7
    assert not decoy_opens, decoy_opens[:10]
    assert not py_outside and not native_outside, "\n".join([*py_outside, "--", *native_outside])
    assert len(python_level) > 0 and (not strace or len(native) > 0)  # the hooks saw the loads
