"""Structured logs: one JSON object per line.

The access log (logger ``memgate.server.access``) writes one line per call with ``rpc``,
``code``, ``ms``, ``request_id``, ``facts`` and ``principal``; it never carries fact texts,
queries or tokens. :class:`JsonFormatter` renders every record the same way, with the fields
a caller passed as ``extra={"fields": {...}}`` merged in.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

__all__ = ["JsonFormatter", "access_logger", "install_json_logging"]

access_logger = logging.getLogger("memgate.server.access")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))


def install_json_logging(level: int | str = logging.INFO) -> None:
    """Route every ``memgate`` logger through one JSON handler on stderr."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("memgate")
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
