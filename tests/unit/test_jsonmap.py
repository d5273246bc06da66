"""The JSON face of the messages (engine.server.jsonmap) and the OpenAPI document
(engine.server.openapi): pure, no server."""

from __future__ import annotations

import json

import pytest

from engine.server.codegen import ensure

ensure()

from engine.errors import InvalidInput  # noqa: E402
from engine.server.jsonmap import (  # noqa: E402
    decode_json,
    encode_json,
    message_from_json,
    message_to_dict,
)
from engine.server.openapi import openapi  # noqa: E402
from engine.server.proto import pb  # noqa: E402


def test_bytes_fields_are_plain_strings_both_ways() -> None:
    body = json.dumps(
        {"facts": [{"namespace": "a/b", "text": "Café in Zürich ✓", "metadataJson": "{}"}]}
    ).encode()
    msg = message_from_json(body, pb.WriteRequest)
    assert msg.facts[0].text == "Café in Zürich ✓".encode()
    assert msg.facts[0].metadata_json == "{}"  # camelCase JSON names are read too
    back = message_to_dict(msg)
    assert back["facts"][0]["text"] == "Café in Zürich ✓"
    assert back["facts"][0]["metadata_json"] == "{}"  # proto names out, defaults printed
    assert back["policy"] == "POLICY_UNSPECIFIED"


def test_a_lone_surrogate_reaches_the_handler_as_invalid_utf8() -> None:
    msg = message_from_json(b'{"namespace": "a/b", "query": "x\\ud800"}', pb.RecallRequest)
    with pytest.raises(UnicodeDecodeError):
        msg.query.decode("utf-8")


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"\xff", "UTF-8"),
        (b"{", "not valid JSON"),
        (b'{"a": NaN}', "NaN"),
        (b"[" * 100_000 + b"]" * 100_000, "nests too deeply"),
        (b"[1]", "JSON object"),
        (b'{"namespace": "a/b", "kk": 1}', "kk"),
        (b'{"namespace": "a/b", "k": "many"}', "RecallRequest"),
        (b'{"namespace": "a/b", "k": -1}', "RecallRequest"),
        (b'{"namespace": "a\\udc00"}', "RecallRequest"),
    ],
)
def test_bad_bodies_are_invalid_input(body: bytes, says: str) -> None:
    with pytest.raises(InvalidInput) as info:
        message_from_json(body, pb.RecallRequest)
    assert says in str(info.value)


def test_empty_body_is_the_empty_message_and_json_is_ascii() -> None:
    assert message_from_json(b"  ", pb.ListReviewRequest) == pb.ListReviewRequest()
    assert encode_json({"t": "é\ud800"}) == b'{"t":"\\u00e9\\ud800"}'
    assert decode_json(b'{"a": [1, 2.5, null]}') == {"a": [1, 2.5, None]}


def test_openapi_is_read_off_the_descriptors() -> None:
    service = pb.DESCRIPTOR.services_by_name["Memgate"]
    doc = openapi(service, version="1")
    assert set(doc["paths"]) == {f"/v1/{m.name}" for m in service.methods} | {"/healthz"}
    schemas = doc["components"]["schemas"]
    for name in ("memgate.v1.WriteRequest", "memgate.v1.Decision", "memgate.v1.Event"):
        message = getattr(pb, name.rsplit(".", 1)[1])
        assert set(schemas[name]["properties"]) == {f.name for f in message.DESCRIPTOR.fields}
        assert schemas[name]["additionalProperties"] is False
    assert schemas["memgate.v1.Event"]["properties"]["seq"]["type"] == ["string", "integer"]
    assert schemas["memgate.v1.Fact"]["properties"]["text"]["type"] == "string"
    write = doc["paths"]["/v1/Write"]["post"]
    assert write["responses"]["429"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"
    }
    json.dumps(doc)  # serialisable as it is


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("engine.server.http", "starlette", "`http` extra"),
        ("engine.server.http", "uvicorn", "`http` extra"),
        ("engine.server.mcp", "mcp", "`mcp` extra"),
    ],
)
def test_a_missing_extra_names_itself(module: str, blocked: str, extra: str) -> None:
    """Importing a door without its extra fails with a message that names the extra."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        f"try:\n    import {module}\nexcept ImportError as exc:\n    print(exc)\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert extra in out.stdout, (out.stdout, out.stderr)


@pytest.mark.parametrize(
    "name", ["keys", "normalize", "key_match_contradiction", "key_match_floor", "verify_reverse"]
)
def test_retired_policy_overrides_are_refused_on_every_door(name: str) -> None:
    """Issue 31 deleted these knobs: over HTTP the field is unknown, from Python the override
    name is unknown, and the proto keeps their numbers reserved."""
    from engine.server.convert import overrides_to_pb

    body = json.dumps({"facts": [], "overrides": {name: 1}}).encode()
    with pytest.raises(InvalidInput):
        message_from_json(body, pb.TriageRequest)
    with pytest.raises(InvalidInput, match="unknown policy override"):
        overrides_to_pb({name: 1})
    reserved = pb.PolicyOverrides.DESCRIPTOR
    assert name not in reserved.fields_by_name


def test_the_later_dated_bar_is_an_override() -> None:
    from engine.server.convert import overrides_from_pb, overrides_to_pb

    msg = overrides_to_pb({"dated_contradiction": 0.7})
    assert overrides_from_pb(msg) == {"dated_contradiction": 0.7}
