"""Page tokens of ListJobs (gpuq.coordinator.front.page_tokens): a token goes on with the
listing that gave it, and anything else is one INVALID_ARGUMENT, never a wrong page."""

from __future__ import annotations

import base64

import pytest

from gpuq.coordinator.front.page_tokens import (
    MAX_TOKEN,
    Cursor,
    decode,
    digest,
    encode,
    page_size,
)
from gpuq.errors import InvalidInput
from gpuq.v1 import queue_pb2


def test_a_token_goes_on_with_its_own_listing() -> None:
    request = queue_pb2.ListJobsRequest(names=["sweep*"], limit=50)
    listing = digest(request)
    cursor = Cursor((41,), 20)
    token = encode(cursor, listing)
    assert len(token) <= MAX_TOKEN
    assert decode(token, listing) == cursor
    assert decode("", listing) is None  # the first page
    # paging fields are not the listing's: a token stays good with another page size
    paged = queue_pb2.ListJobsRequest(names=["sweep*"], limit=50, page_size=3, page_token=token)
    assert digest(paged) == listing
    assert decode(encode(Cursor((3, 77), 0), listing), listing) == Cursor((3, 77), 0)


@pytest.mark.parametrize(
    "token",
    [
        "garbage",
        "!!!!",
        "x" * (MAX_TOKEN + 1),
        base64.urlsafe_b64encode(b"[1]").decode(),
        base64.urlsafe_b64encode(b'[1,"abc",[-5],0]').decode(),
        base64.urlsafe_b64encode(b'[1,"abc",[1,2,3],0]').decode(),
        base64.urlsafe_b64encode(b'[2,"abc",[5],0]').decode(),
        base64.urlsafe_b64encode(b'[1,"abc",["5"],0]').decode(),
        base64.urlsafe_b64encode(b'{"a": 1}').decode(),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    ],
)
def test_anything_else_is_refused_in_one_line(token: str) -> None:
    with pytest.raises(InvalidInput, match=r"page_token.*list again from the first page"):
        decode(token, "abc")


def test_a_token_of_another_filter_is_refused() -> None:
    mine = digest(queue_pb2.ListJobsRequest(user="alice"))
    token = encode(Cursor((9,), 3), mine)
    for other in (
        queue_pb2.ListJobsRequest(user="bob"),
        queue_pb2.ListJobsRequest(user="alice", finished=True),
        queue_pb2.ListJobsRequest(user="alice", limit=4),
    ):
        with pytest.raises(InvalidInput, match="another listing"):
            decode(token, digest(other))


def test_a_page_is_at_most_the_largest() -> None:
    assert page_size(0, 1000) == 1000
    assert page_size(10, 1000) == 10
    assert page_size(2**32 - 1, 1000) == 1000
