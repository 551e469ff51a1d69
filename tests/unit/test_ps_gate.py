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
