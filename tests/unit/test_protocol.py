from __future__ import annotations

import base64
import contextlib
import json
import zlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuops.core import protocol as proto


def _line(obj: object) -> bytes:
    return json.dumps(obj).encode()


def test_valid_request() -> None:
    req = proto.parse_request(_line({"v": 1, "id": 7, "op": "sample"}))
    assert (req.id, req.op, req.args) == (7, "sample", {})


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (b"not json", proto.PARSE_ERROR),
        (b"\xff\xfe", proto.PARSE_ERROR),
        (_line([1, 2]), proto.INVALID_REQUEST),
        (_line({"v": 1, "op": "hello"}), proto.INVALID_REQUEST),
        (_line({"v": 1, "id": True, "op": "hello"}), proto.INVALID_REQUEST),
        (_line({"v": 2, "id": 1, "op": "hello"}), proto.UNSUPPORTED_VERSION),
        (_line({"v": 1, "id": 1, "op": "reboot"}), proto.UNKNOWN_OP),
        (_line({"v": 1, "id": 1, "op": "hello", "args": []}), proto.INVALID_ARGS),
        (_line({"v": 1, "id": 1, "op": "hello", "extra": 1}), proto.INVALID_REQUEST),
        (b"{" + b" " * proto.MAX_REQUEST_BYTES + b"}", proto.TOO_LARGE),
    ],
)
def test_bad_requests_have_codes(line: bytes, code: str) -> None:
    with pytest.raises(proto.ProtocolError) as info:
        proto.parse_request(line)
    assert info.value.code == code


def test_error_keeps_the_request_id_when_known() -> None:
    with pytest.raises(proto.ProtocolError) as info:
        proto.parse_request(_line({"v": 1, "id": "abc", "op": "nope"}))
    assert info.value.request_id == "abc"


def test_watch_args() -> None:
    assert proto.watch_args({}) == (1.0, None, False)
    assert proto.watch_args({"interval": 0.5, "count": 3, "delta": True}) == (0.5, 3, True)
    for bad in (
        {"interval": 0},
        {"interval": "1s"},
        {"count": 0},
        {"count": True},
        {"every": 1},
        {"delta": 1},
        {"rows": ["timestamp"]},
        {"delta": True, "rows": []},
        {"delta": True, "rows": "timestamp"},
        {"delta": True, "rows": ["timestamp", "timestamp"]},
        {"delta": True, "rows": [""]},
    ):
        with pytest.raises(ValueError):
            proto.watch_args(bad)
    assert proto.watch_rows({"delta": True}) is None
    assert proto.watch_align({}) is False and proto.watch_align({"align": True}) is True
    with pytest.raises(ValueError):
        proto.watch_args({"align": 1})
    assert proto.watch_rows({"delta": True, "rows": ["a", "b"]}) == ("a", "b")


def test_version_negotiation() -> None:
    assert proto.hello_versions({"versions": [1, 5]}) == 1
    with pytest.raises(proto.ProtocolError) as info:
        proto.hello_versions({"versions": [2, 3]})
    assert info.value.code == proto.UNSUPPORTED_VERSION


def test_messages_round_trip() -> None:
    assert proto.parse_message(proto.reply(3, {"a": 1})) == proto.Message(3, True, {"a": 1})
    err = proto.parse_message(proto.error(None, proto.TOO_LARGE, "big"))
    assert (err.ok, err.error_code, err.error_message) == (False, proto.TOO_LARGE, "big")
    ev = proto.parse_message(proto.event(4, "sample", 2, {}))
    assert (ev.event, ev.seq, ev.id) == ("sample", 2, 4)
    delta = proto.parse_message(proto.delta_event(4, "sample", 3, {"~": {}}))
    assert (delta.is_delta, delta.rows, delta.delta) == (True, False, {"~": {}})
    rows = proto.parse_message(proto.rows_event(4, "sample", 4, [1.0, []]))
    assert (rows.is_delta, rows.rows, rows.delta, rows.seq) == (True, True, [1.0, []], 4)
    assert rows == proto.Message(4, True, event="sample", seq=4, delta=[1.0, []], is_delta=True, rows=True)


def test_parse_message_takes_another_json_parser() -> None:
    orjson = pytest.importorskip("orjson")
    line = proto.rows_event(4, "sample", 4, [1.0, [None]])
    assert proto.parse_message(line, orjson.loads) == proto.parse_message(line)
    for bad in (b"{nope", b'{"v": 1, "id": 1, "ok": NaN}', b"\xff"):
        with pytest.raises(proto.ProtocolError) as info:
            proto.parse_message(bad, orjson.loads)
        assert info.value.code == proto.PARSE_ERROR


@given(st.binary(max_size=300))
def test_parse_request_only_raises_protocol_errors(line: bytes) -> None:
    with contextlib.suppress(proto.ProtocolError):
        proto.parse_request(line)


@given(st.binary(max_size=300))
def test_parse_message_only_raises_protocol_errors(line: bytes) -> None:
    with contextlib.suppress(proto.ProtocolError):
        proto.parse_message(line)
    orjson = pytest.importorskip("orjson")
    with contextlib.suppress(proto.ProtocolError):
        proto.parse_message(line, orjson.loads)


def test_every_op_is_documented() -> None:
    """The module's docstring and docs/architecture.md list every op the agent serves."""
    from pathlib import Path

    architecture = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    agent_section = architecture.split("## The agent", 1)[1].split("\n## ", 1)[0]
    doc = proto.__doc__ or ""
    for op in proto.OPS:
        assert f"`{op}`" in doc, op
        assert f"`{op}`" in agent_section, op


def test_history_args_take_compress_zlib_or_nothing() -> None:
    assert proto.history_args({"compress": "zlib"}) == ("hour", None, None)
    assert proto.history_args({"compress": None, "resolution": "minute"}) == ("minute", None, None)
    with pytest.raises(ValueError, match="'compress' must be 'zlib' or null"):
        proto.history_args({"compress": "gzip"})


def test_inflate_history_gives_back_the_json_and_refuses_what_is_not_a_deflated_history() -> None:
    text = json.dumps({"resolution": "hour", "buckets": ["x" * 1000]})
    assert proto.inflate_history(proto.deflate_history(text)) == text.encode()
    packed = proto.deflate_history(text)["zlib"]
    raw = base64.b64decode(packed)
    cases: list[tuple[object, str]] = [
        ({"resolution": "hour"}, "expected"),  # an uncompressed result where a deflated one was asked
        ({"zlib": packed, "extra": 1}, "expected"),
        ({"zlib": 7}, "expected"),
        ({"zlib": "not base64!"}, "not base64"),
        ({"zlib": "é"}, "not base64"),
        ({"zlib": base64.b64encode(b"plain text").decode()}, "zlib: Error"),
        ({"zlib": base64.b64encode(raw[:-6]).decode()}, "cut short"),
        ({"zlib": base64.b64encode(raw + b"tail").decode()}, "followed by other data"),
    ]
    for result, says in cases:
        with pytest.raises(ValueError, match=says):
            proto.inflate_history(result)
    # A bomb: 64 MiB of zeros deflate to 64 KiB; never inflated past the limit.
    bomb = {"zlib": base64.b64encode(zlib.compress(b"0" * (64 << 20), 9)).decode()}
    with pytest.raises(ValueError, match="more than 1048576 bytes once inflated"):
        proto.inflate_history(bomb, limit=1 << 20)


_CUT_STREAMS = st.builds(lambda b: zlib.compress(b)[: len(b) // 2 + 3], st.binary())


@given(st.one_of(st.binary(max_size=300), _CUT_STREAMS))
def test_inflate_history_of_any_bytes_is_bytes_within_the_limit_or_one_value_error(data: bytes) -> None:
    try:
        text = proto.inflate_history({"zlib": base64.b64encode(data).decode()}, limit=4096)
    except ValueError as exc:
        assert "\n" not in str(exc)
    else:
        assert len(text) <= 4096
