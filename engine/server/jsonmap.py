"""The JSON face of the ``memgate.v1`` messages, for the HTTP/JSON and MCP doors.

Bodies are the protobuf JSON mapping of the gRPC messages (``google.protobuf.json_format``),
generic over the descriptors, so a field added to ``protos/`` appears here with no edit. Two
choices on top of the standard mapping:

* **text is text**: a field that is ``bytes`` in the proto (``Fact.text``, ``RecallRequest.query``)
  is ``bytes`` only so that a gRPC request with invalid UTF-8 is answered INVALID_ARGUMENT by us
  rather than by grpcio. A JSON string is already text, so on this door such a field is a plain
  JSON string (not base64). Its UTF-8 encoding goes to the handler, which checks it as it checks
  gRPC bytes: a lone surrogate (``"\\ud800"``) encodes to invalid UTF-8 and is refused the same way.
* **names as in the proto**: responses use the proto field names (``memory_id``), and print
  every field, defaults included; requests accept both those and the lowerCamelCase JSON names.
  64-bit integers are JSON strings, as the mapping says (``Event.seq``, ``next_after_seq``).

Anything that does not parse (not UTF-8, not JSON, not an object, an unknown field, a value of
the wrong type or range) is :class:`~engine.errors.InvalidInput`. Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from functools import cache, partial
from typing import Any

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from engine.errors import InvalidInput

__all__ = ["decode_json", "encode_json", "message_from_json", "message_to_dict", "parse_message"]


@cache
def _fields(descriptor: Descriptor) -> dict[str, FieldDescriptor]:
    """A message's fields by proto name and by JSON name."""
    out: dict[str, FieldDescriptor] = {}
    for f in descriptor.fields:
        out[f.name] = f
        out[f.json_name] = f
    return out


def _is_repeated(field: FieldDescriptor) -> bool:
    return bool(field.is_repeated) if hasattr(field, "is_repeated") else field.label == 3


def _map_texts(value: Any, descriptor: Descriptor, text: Callable[[Any], Any]) -> Any:
    """A copy of ``value`` (a JSON object for ``descriptor``) with ``text`` applied to every
    bytes field, nested messages and repeated fields included. Anything unexpected is left as
    it is, for ``json_format`` to refuse with its own message."""
    if not isinstance(value, dict):
        return value
    out = dict(value)
    for key, item in value.items():
        field = _fields(descriptor).get(key) if isinstance(key, str) else None
        if field is None:
            continue
        convert: Callable[[Any], Any]
        if field.type == FieldDescriptor.TYPE_BYTES:
            convert = text
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            convert = partial(_map_texts, descriptor=field.message_type, text=text)
        else:
            continue
        if _is_repeated(field) and isinstance(item, list):
            out[key] = [convert(v) for v in item]
        else:
            out[key] = convert(item)
    return out


def _text_to_wire(value: Any, descriptor: Descriptor) -> Any:
    """``value`` with its bytes fields' plain strings turned into the base64 that
    ``json_format`` reads."""
    return _map_texts(value, descriptor, _encode_text)


def _encode_text(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    # surrogatepass: a lone surrogate becomes invalid UTF-8, which the handler refuses exactly
    # as it refuses invalid UTF-8 over gRPC (naming the field and the byte).
    return base64.b64encode(value.encode("utf-8", "surrogatepass")).decode("ascii")


def _text_from_wire(value: Any, descriptor: Descriptor) -> Any:
    """The inverse of :func:`_text_to_wire`, for responses (``MessageToDict`` output)."""
    return _map_texts(value, descriptor, _decode_text)


def _decode_text(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return base64.b64decode(value).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return value


def _reject_constant(name: str) -> Any:
    raise InvalidInput(f"the body holds {name}, which is not JSON")


def decode_json(body: bytes, what: str = "the body") -> Any:
    """Strict JSON: UTF-8 only, no NaN / Infinity literals, bounded nesting."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"{what} is not valid UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except InvalidInput:
        raise
    except RecursionError:
        raise InvalidInput(f"{what} nests too deeply") from None
    except ValueError as exc:
        raise InvalidInput(f"{what} is not valid JSON: {exc}") from None


def parse_message(value: Any, cls: type[Message], what: str = "the body") -> Any:
    """A message of type ``cls`` from a decoded JSON value (an object)."""
    if not isinstance(value, dict):
        raise InvalidInput(f"{what} must be a JSON object ({cls.DESCRIPTOR.name})")
    msg = cls()
    try:
        json_format.ParseDict(_text_to_wire(value, cls.DESCRIPTOR), msg)
    except RecursionError:
        raise InvalidInput(f"{what} nests too deeply") from None
    except Exception as exc:  # noqa: BLE001 - any parser failure is the caller's bad input
        raise InvalidInput(f"{what} is not a valid {cls.DESCRIPTOR.name}: {exc}") from None
    return msg


def message_from_json(body: bytes, cls: type[Message], what: str = "the body") -> Any:
    """A request message from a JSON body; an empty body is the empty message."""
    if not body.strip():
        return cls()
    return parse_message(decode_json(body, what), cls, what)


def message_to_dict(msg: Message) -> dict[str, Any]:
    """A response message as a JSON-ready dict (proto field names, defaults printed)."""
    out = json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _text_from_wire(out, msg.DESCRIPTOR)  # type: ignore[no-any-return]


def encode_json(value: Any) -> bytes:
    """Compact JSON, ASCII-escaped (so no text can make the encoder fail)."""
    return json.dumps(value, separators=(",", ":")).encode("ascii")
