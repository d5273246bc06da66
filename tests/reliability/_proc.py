"""The real ``memgate serve`` as a subprocess, for tests that kill it or limit it.

* :func:`start_server` (:func:`spawn_server`, then :func:`wait_serving`) runs
  ``python -m engine [--cache-dir C] serve --port P --data-dir D ...`` in its own process
  (optionally under ``RLIMIT_FSIZE``), waits until its health service answers SERVING and
  records how long that took (``ServerProc.serving_s``: from process start to SERVING, imports,
  model loading and store recovery included). :meth:`ServerProc.kill` is ``kill -9``;
  :meth:`ServerProc.stop` is SIGTERM (a graceful drain). The server's stderr is drained by a
  thread into ``ServerProc.log`` (a full pipe would block the server).
* :func:`tiny_models` builds a model cache (call it from a session or module fixture)
  holding a tiny random-weight MiniLM stand-in (BERT, 384-d output like the real one) and a
  tiny random DeBERTa NLI model, with the real pipeline (export, parity check, manifest): about
  10 s. A server on it reaches SERVING in under a second here, against 3-6 s on the real
  models, which is what a test that restarts the server 50 times needs; serve it with
  :data:`TINY_FLAGS`. Its decisions are noise: use it only where the thing under test is not
  the model (durability, fail-stop). Needs the ``export`` extra (torch, optimum).

Others may import these; keep the API small and documented.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _tiny import DEBERTA_CONFIG, write_tokenizer

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable

__all__ = [
    "ROOT",
    "TINY_FLAGS",
    "ServerProc",
    "ServerStartError",
    "free_port",
    "spawn_server",
    "start_server",
    "tiny_models",
    "wait_serving",
]

TINY_FLAGS: tuple[str, ...] = ("--allow-random-weights", "--threads", "1")
"""``serve`` flags for a :func:`tiny_models` cache: its NLI model has random weights."""


# ``python -c _LIMITED BYTES -m engine ...``: set the file-size limit, ignore SIGXFSZ (so the
# write fails with EFBIG instead of killing the process), then exec the real command line.
_LIMITED = (
    "import os, resource, signal, sys; "
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
    "limit = int(sys.argv[1]); "
    "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
)


class ServerStartError(RuntimeError):
    """The server exited, or did not answer SERVING in time; the message holds its log tail."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class ServerProc:
    popen: subprocess.Popen[bytes]
    port: int
    data_dir: Path
    serving_s: float = float("nan")
    """Seconds from process start to the first SERVING answer."""
    started: float = 0.0
    """``time.monotonic()`` when the process was started."""
    log: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> int:
        """SIGKILL (kill -9) and reap; returns the exit status."""
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
        return self._reap()

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (graceful drain) and reap; SIGKILL if it does not end in ``timeout``."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        return self._reap()

    def _reap(self) -> int:
        code = self.popen.wait(60)
        if self._reader is not None:
            self._reader.join(10)
        if self.popen.stderr is not None:
            self.popen.stderr.close()
        return code

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log[-lines:])


def _health(target: str, timeout: float) -> str | None:
    """The server's health status, or None when it does not answer."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=timeout
            )
        except grpc.RpcError:
            return None
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def start_server(
    data_dir: Path,
    *,
    cache_dir: Path | None = None,
    flags: Sequence[str] = (),
    fsize_limit: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60.0,
    port: int | None = None,
) -> ServerProc:
    """Start ``memgate serve`` on 127.0.0.1 and wait for SERVING (or raise
    :class:`ServerStartError` with the log tail). ``fsize_limit``: the server runs under
    ``RLIMIT_FSIZE`` of that many bytes with SIGXFSZ ignored, so a write past it fails with
    ``EFBIG`` (a real write error; set by a tiny exec wrapper, not a ``preexec_fn``)."""
    proc = spawn_server(
        data_dir,
        cache_dir=cache_dir,
        flags=flags,
        fsize_limit=fsize_limit,
        env=env,
        port=port,
    )
    wait_serving(proc, timeout)
    return proc


def spawn_server(
    data_dir: Path,
    *,
    cache_dir: Path | None = None,
    flags: Sequence[str] = (),
    fsize_limit: int | None = None,
    env: dict[str, str] | None = None,
    port: int | None = None,
) -> ServerProc:
    """Start ``memgate serve`` and return at once (see :func:`start_server`)."""
    port = port or free_port()
    cmd = [PYTHON]
    if fsize_limit is not None:
        cmd += ["-c", _LIMITED, str(int(fsize_limit))]
    cmd += ["-m", "engine"]
    if cache_dir is not None:
        cmd += ["--cache-dir", str(cache_dir)]
    cmd += [
        "serve",
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--no-access-log",
        "--grace",
        "2",
        *flags,
    ]
    started = time.monotonic()
    popen = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
    )
    proc = ServerProc(popen, port, Path(data_dir))

    def drain() -> None:
        assert popen.stderr is not None
        for raw in popen.stderr:
            proc.log.append(raw.decode("utf-8", "replace").rstrip())

    proc._reader = threading.Thread(target=drain, name=f"memgate-serve-{port}-log", daemon=True)
    proc._reader.start()
    proc.started = started
    return proc


def wait_serving(proc: ServerProc, timeout: float = 60.0) -> None:
    """Wait until ``proc`` answers SERVING; sets ``proc.serving_s``."""
    started, target, popen = proc.started, proc.target, proc.popen
    while True:
        if not proc.alive():
            proc._reap()
            raise ServerStartError(f"the server exited with {popen.returncode}:\n{proc.tail()}")
        if _health(target, 0.25) == "SERVING":
            proc.serving_s = time.monotonic() - started
            return
        if time.monotonic() - started > timeout:
            proc.kill()
            raise ServerStartError(f"no SERVING after {timeout} s:\n{proc.tail()}")
        time.sleep(0.01)


# -- a tiny model cache --------------------------------------------------------------------------
_WORDS = (
    "the a user customer office plan is in at on of and to my lives moved works likes fact "
    "episode note writer cycle number tea coffee denver austin chicago lisbon porto gold silver"
).split()
_TINY_BERT: dict[str, Any] = {
    "model_type": "bert",
    "architectures": ["BertModel"],
    "hidden_size": 384,  # the index expects the real MiniLM's dimension
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 128,
}
_TINY_DEBERTA: dict[str, Any] = {**DEBERTA_CONFIG, "num_hidden_layers": 1}


def _tokenizer(directory: Path) -> int:
    return write_tokenizer(directory, _WORDS)


def tiny_models(root: Path) -> Path:
    """Build the tiny cache under ``root`` (``<root>/models/minilm/fp32`` and
    ``<root>/models/nli-deberta-v3-small/fp32``) and return ``root``: pass it as ``cache_dir``
    and serve with :data:`TINY_FLAGS`."""
    from engine.pipeline.build import RandomInit, export_embedder, export_nli

    tok_dir = root / "tokenizer"
    vocab_size = _tokenizer(tok_dir)
    lines: list[str] = []
    export_embedder(
        RandomInit(config={**_TINY_BERT, "vocab_size": vocab_size}, tokenizer=tok_dir),
        root / "models" / "minilm",
        variants=["fp32"],
        log=lines.append,
    )
    export_nli(
        RandomInit(config={**_TINY_DEBERTA, "vocab_size": vocab_size}, tokenizer=tok_dir),
        root / "models" / "nli-deberta-v3-small",
        variants=["fp32"],
        log=lines.append,
    )
    return root
