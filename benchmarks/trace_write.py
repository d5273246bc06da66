"""One fact's path from a gRPC Write to its COMMIT, counted: which engine files it passes
through and how many times a call crosses from one file into another (issue 32's "crossings").

A real in-process server (``ServerThread``) over the real models and a SQLite store on a temp
directory; one warm-up Write (lazy set-up out of the way), then one traced Write of a fact that
replaces the warm-up's memory (recall, NLI, decision and supersede all run). Every thread is
profiled; a crossing is a call from a function in one ``engine/`` file into a function defined
in another (the client's own module and the generated stubs are left out), counted once per
distinct (caller function, callee function) pair.

    python benchmarks/trace_write.py [--cache-dir DIR] [--json OUT] [--list]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import ROOT, run_header  # noqa: E402

ENGINE = str(ROOT / "engine") + "/"
LEFT_OUT = ("/_proto/", "/engine/client.py")


def _ours(path: str) -> bool:
    return path.startswith(ENGINE) and not any(x in path for x in LEFT_OUT)


class Tracer:
    """A profile function for every thread that records cross-file calls while ``on`` is set."""

    def __init__(self) -> None:
        self.on = threading.Event()
        self.crossings: Counter[tuple[str, str, str, str]] = Counter()
        self.files: set[str] = set()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or not self.on.is_set():
            return
        callee = frame.f_code.co_filename
        if not _ours(callee):
            return
        self.files.add(callee)
        caller = frame.f_back
        # the nearest engine frame up the stack: calls made through a library (grpc, asyncio,
        # a thread pool) still count as crossing from that engine file
        while caller is not None and not _ours(caller.f_code.co_filename):
            caller = caller.f_back
        if caller is None or caller.f_code.co_filename == callee:
            return
        self.crossings[
            (caller.f_code.co_filename, caller.f_code.co_name, callee, frame.f_code.co_name)
        ] += 1


def main(argv: list[str] | None = None) -> int:
    from engine.runtime.layout import default_cache_dir

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache-dir", type=Path, default=default_cache_dir())
    p.add_argument("--json", type=Path, help="write the figures and every crossing here")
    p.add_argument("--list", action="store_true", help="print every crossing")
    args = p.parse_args(argv)

    from engine.app import EngineSettings, open_engine
    from engine.client import MemgateClient
    from engine.server import ServerSettings, ServerThread
    from engine.types import Fact

    tracer = Tracer()
    threading.setprofile(tracer)
    sys.setprofile(tracer)
    with tempfile.TemporaryDirectory() as tmp:
        settings = EngineSettings(cache_dir=args.cache_dir, data_dir=Path(tmp), snapshots=False)
        with open_engine(settings) as eng:
            server = ServerThread(eng.gate, ServerSettings(host="127.0.0.1", port=0))
            server.start()
            try:
                client = MemgateClient(server.target)
                first = client.write([Fact(namespace="trace", text="Alice lives in Denver.")])
                tracer.on.set()
                second = client.write([Fact(namespace="trace", text="Alice lives in Chicago.")])
                tracer.on.clear()
                client.close()
            finally:
                server.stop(1.0)
    sys.setprofile(None)
    threading.setprofile(None)  # type: ignore[arg-type]
    rel = lambda path: str(Path(path).relative_to(ROOT))  # noqa: E731
    files = sorted(rel(f) for f in tracer.files)
    crossings = sorted(f"{rel(a)}:{fa} -> {rel(b)}:{fb}" for (a, fa, b, fb) in tracer.crossings)
    boundaries = sorted({(rel(a), rel(b)) for (a, _, b, _) in tracer.crossings})
    header = run_header("trace_write", args)
    print(f"decisions: {first.decisions[0].action} then {second.decisions[0].action}")
    print(f"files on the path: {len(files)}")
    print(f"file boundaries (distinct caller file -> callee file): {len(boundaries)}")
    print(
        f"crossings (distinct caller function -> callee function in another file): {len(crossings)}"
    )
    if args.list:
        print("\n".join(crossings))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "figures": {
                        "files": len(files),
                        "boundaries": len(boundaries),
                        "crossings": len(crossings),
                    },
                    "file_list": files,
                    "boundaries": [list(b) for b in boundaries],
                    "crossings": crossings,
                    "actions": [first.decisions[0].action, second.decisions[0].action],
                    **header,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
