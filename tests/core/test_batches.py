"""The Batch API's rules: input lines, statuses, headroom for batch requests."""

from __future__ import annotations

import json

import pytest

from llmgw.core.batches import (
    BatchInputError,
    BatchStatus,
    check_metadata,
    headroom,
    may_move,
    parse_input,
)


def _line(custom_id: str = "a", url: str = "/v1/chat/completions", **body: object) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": {"model": "m", **body}})


def _raw(**fields: object) -> str:
    return json.dumps({"custom_id": "a", "url": "/v1/chat/completions", **fields})


def test_each_line_is_one_request_in_the_file_s_order() -> None:
    data = "\n".join([_line("a"), "", _line("b")]).encode()
    lines = parse_input(data, "/v1/chat/completions")
    assert [(line.index, line.custom_id, line.model) for line in lines] == [(0, "a", "m"), (1, "b", "m")]


@pytest.mark.parametrize(
    ("text", "line", "said"),
    [
        (_line("a") + "\n{not json", 2, "not JSON"),
        (_line("a") + "\n" + _line("a"), 2, "used twice"),
        (_line("a", url="/v1/embeddings"), 1, "one endpoint per batch"),
        (_raw(method="GET", body={"model": "m"}), 1, "POST"),
        (_raw(method="POST", body={}), 1, "model"),
        (_line("a", stream=True), 1, "cannot stream"),
        ("[1]", 1, "JSON object"),
    ],
)
def test_a_bad_line_is_named_with_what_is_wrong(text: str, line: int, said: str) -> None:
    with pytest.raises(BatchInputError) as caught:
        parse_input(text.encode(), "/v1/chat/completions")
    assert caught.value.line == line and said in caught.value.message


def test_an_empty_file_or_one_too_long_is_refused() -> None:
    with pytest.raises(BatchInputError, match="no request"):
        parse_input(b"\n\n", "/v1/chat/completions")
    with pytest.raises(BatchInputError, match="at most 2"):
        parse_input("\n".join(_line(str(i)) for i in range(3)).encode(), "/v1/chat/completions", 2)
    with pytest.raises(BatchInputError, match="takes no batch"):
        parse_input(_line().encode(), "/v1/images/generations")


def test_statuses_move_only_forward() -> None:
    assert may_move(BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)
    assert may_move(BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING)
    assert not may_move(BatchStatus.COMPLETED, BatchStatus.IN_PROGRESS)
    assert not may_move(BatchStatus.CANCELLING, BatchStatus.COMPLETED)
    assert BatchStatus.EXPIRED.ended and not BatchStatus.FINALIZING.ended


def test_metadata_is_held_to_openai_s_bounds() -> None:
    assert check_metadata({"a": "b"}) == {"a": "b"}
    assert check_metadata(None) is None
    with pytest.raises(ValueError, match="16"):
        check_metadata({str(i): "v" for i in range(17)})
    with pytest.raises(ValueError, match="512"):
        check_metadata({"a": "x" * 513})


def test_batch_requests_take_only_the_slots_interactive_traffic_leaves_under_the_share() -> None:
    assert headroom(slots=4, engine_load=0, batch_in_flight=0, share=0.5).allowed == 2
    assert headroom(slots=4, engine_load=2, batch_in_flight=2, share=0.5).allowed == 0
    assert headroom(slots=4, engine_load=2, batch_in_flight=1, share=0.5).allowed == 0
    assert headroom(slots=4, engine_load=3, batch_in_flight=0, share=0.5).allowed == 0
    assert headroom(slots=1, engine_load=0, batch_in_flight=0, share=0.5).allowed == 1
    assert headroom(slots=1, engine_load=1, batch_in_flight=0, share=0.5).allowed == 0
    assert headroom(slots=0, engine_load=0, batch_in_flight=0, share=0.5).allowed == 0
