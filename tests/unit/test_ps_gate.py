"""elephant.ps.gate: what the gate makes of a request head, without a socket."""

from __future__ import annotations

import pytest

from elephant.ps.gate import MAX_HEAD, Head, parse_head

AUTH = b"Bearer tok"


def head(*lines: bytes) -> bytes:
    return b"\r\n".join((b"POST /commit HTTP/1.1", *lines)) + b"\r\n\r\n"


@pytest.mark.parametrize("buffer, verdict", [
    (b"POST /commit HTTP/1.1\r\nAuthorization: Bearer tok\r\n", None),  # not all here yet
    (head(b"Authorization: Bearer tok", b"Content-Length: x"), Head(400)),
    (head(b"Authorization: Bearer tok", b"Transfer-Encoding: chunked"), Head(411)),
    (head(b"Content-Length: 4"), Head(401)),
    (head(b"Authorization: Bearer nope", b"Content-Length: 4"), Head(401)),
    (b"x" * (MAX_HEAD + 1), Head(431)),
])
def test_a_head_is_refused_before_its_body_is_read(buffer, verdict):
    assert parse_head(buffer, AUTH) == verdict


def test_an_authorized_head_is_served_with_its_length_and_the_body_left_behind():
    raw = head(b"authorization:  Bearer tok ", b"Content-Length: 4")
    assert parse_head(raw + b"body", AUTH) == Head(0, raw, 4)


# ------------------------------------------------------------------ the handler's one-pass head parser
import http.client  # noqa: E402
import io  # noqa: E402

from elephant.ps.http import MAX_FIELDS, Fields, parse_plain_head  # noqa: E402


def _email_parse(raw: bytes):
    stream = io.BytesIO(raw)
    stream.readline()
    return http.client.parse_headers(stream)


@pytest.mark.parametrize("raw", [
    head(b"Host: 127.0.0.1:4000", b"Authorization: Bearer tok", b"Content-Length: 33264",
         b"Accept-Encoding: identity", b"Content-Type: application/octet-stream"),
    head(b"x-a:1", b"X-A:  2  ", b"Empty:", b"Odd: caf\xe9"),  # repeats, no space, empty and latin-1 values
    b"GET /weights?worker=0&epoch=3 HTTP/1.0\r\n\r\n",
])
def test_a_plain_head_parses_as_http_servers_parser_does(raw):
    method, target, version, fields = parse_plain_head(raw)
    line = raw.split(b"\r\n")[0].decode().split(" ")
    assert [method, target, version] == line
    expected = _email_parse(raw)
    assert [(name, value.strip()) for name, value in expected.items()] == fields.items()
    for name in ("HOST", "x-a", "content-length", "missing"):
        assert fields.get(name) == (expected.get(name).strip() if expected.get(name) is not None else None)
    assert fields.get_all("x-a", []) == [v.strip() for v in (expected.get_all("x-a") or [])]


@pytest.mark.parametrize("raw", [
    b"GET /health\r\n\r\n",  # HTTP/0.9
    b"GET /health HTTP/2.0\r\n\r\n",
    b"GET  /health HTTP/1.1\r\n\r\n",  # not three words
    head(b"X-Folded: a", b" b"),  # obsolete folding
    head(b"Bad Name: 1"),
    head(b"NoColon"),
    head(b": no name"),
    head(*[b"X-%d: 1" % i for i in range(MAX_FIELDS + 1)]),
])
def test_a_head_that_is_not_plain_is_left_to_http_server(raw):
    assert parse_plain_head(raw) is None


def test_fields_look_up_names_in_any_case_and_return_the_first():
    fields = Fields([("Connection", "close"), ("X-A", "1"), ("x-a", "2")])
    assert fields["CONNECTION"] == "close" and fields.get("x-A") == "1" and fields.get("nope", "d") == "d"
    assert fields.get_all("X-a") == ["1", "2"] and "connection" in fields and "Nope" not in fields
    assert list(fields) == ["Connection", "X-A", "x-a"] and len(fields) == 3
