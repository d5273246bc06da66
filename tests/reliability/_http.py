"""The reliability suite's HTTP/JSON caller: the same :class:`~_tenants.Answer` as the gRPC
helpers, so a suite written against gRPC (the isolation matrix, the fuzz oracles) runs over the
HTTP door unchanged.

Requests are the ``memgate.v1`` messages the gRPC tests build, sent as their JSON mapping
(``engine.server.jsonmap``, text as plain strings; bytes that are not UTF-8 travel as the lone
surrogates Python's ``surrogateescape`` makes of them, which a JSON string can carry and the
server must refuse). Answers carry the raw body and every response header, for leak checks.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from typing import Any

import httpx
from _tenants import TIMEOUT, Answer
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from engine.server.proto import pb

__all__ = ["HttpCaller", "request_json"]


def _texts(value: Any, descriptor: Descriptor) -> Any:
    """``MessageToDict`` output with bytes fields as text (invalid UTF-8: lone surrogates)."""
    if not isinstance(value, dict):
        return value
    fields = {f.name: f for f in descriptor.fields}
    for key, item in value.items():
        f = fields.get(key)
        if f is None:
            continue
        if f.type == FieldDescriptor.TYPE_BYTES:

            def conv(v: Any) -> Any:
                return base64.b64decode(v).decode("utf-8", "surrogateescape")

        elif f.type == FieldDescriptor.TYPE_MESSAGE:

            def conv(v: Any, d: Descriptor = f.message_type) -> Any:
                return _texts(v, d)

        else:
            continue
        value[key] = [conv(v) for v in item] if isinstance(item, list) else conv(item)
    return value


def request_json(msg: Any) -> dict[str, Any]:
    """A request message as the HTTP door's JSON body (proto names, text as strings)."""
    out = json_format.MessageToDict(msg, preserving_proto_field_name=True)
    return _texts(out, msg.DESCRIPTOR)  # type: ignore[no-any-return]


def _encode(value: Any) -> bytes:
    # ensure_ascii: lone surrogates become \udcXX escapes, which is valid JSON text.
    return json.dumps(value).encode("ascii")


class HttpCaller:
    """POST /v1/<Rpc> with httpx; ``call`` answers like ``_tenants.ask`` / ``ask_stream``."""

    def __init__(self, port: int) -> None:
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=TIMEOUT)

    def close(self) -> None:
        self.client.close()

    @staticmethod
    def _headers(token: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
        out = {"authorization": f"Bearer {token}"} if token else {}
        return out | (extra or {})

    def raw(
        self, rpc: str, body: bytes, token: str | None, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        ct = "application/x-ndjson" if rpc == "Backfill" else "application/json"
        merged = {"content-type": ct} | self._headers(token, headers)
        return self.client.post(f"/v1/{rpc}", content=body, headers=merged)

    def answer(self, rpc: str, r: httpx.Response) -> Answer:
        """The :class:`Answer` of a finished response (asserting the door's own contract:
        a JSON error body whose code and status agree with the one table)."""
        metadata = tuple((k, v) for k, v in r.headers.items())
        if r.status_code != 200:
            body = r.json()
            assert set(body) == {"code", "message", "request_id"}, body
            assert body["request_id"] == r.headers["x-request-id"]
            return Answer(body["code"], body["message"], r.content, metadata)
        if rpc == "Backfill":
            got: list[Any] = []
            for line in r.text.splitlines():
                item = json.loads(line)
                if "error" in item:
                    err = item["error"]
                    return Answer(err["code"], err["message"], r.content, metadata, tuple(got))
                got.append(json_format.ParseDict(item, pb.BackfillResponse()))
            return Answer("OK", "", r.content, metadata, tuple(got))
        method = pb.DESCRIPTOR.services_by_name["Memgate"].methods_by_name[rpc]
        msg = json_format.ParseDict(r.json(), getattr(pb, method.output_type.name)())
        return Answer("OK", "", r.content, metadata, (msg,))

    def call(self, rpc: str, request: Any, token: str | None) -> Answer:
        if rpc == "Backfill":
            items: Iterable[Any] = request
            body = b"".join(_encode(request_json(m)) + b"\n" for m in items)
        else:
            body = _encode(request_json(request))
        return self.answer(rpc, self.raw(rpc, body, token))
