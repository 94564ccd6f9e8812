"""ReplyText: streamed content goes out only once the finished reply is sure to start with
it, so the pieces join to exactly the non-streamed content."""

from __future__ import annotations

from typing import Any

from agentrft.serve.stream_text import ReplyText


def pieces(text: ReplyText, ids: list[int]) -> list[str]:
    return [p for p in (text.add(t) for t in ids) if p]


def test_pieces_join_to_the_text_and_wait_for_whole_characters(tokenizer: Any) -> None:
    reply = "Café ☕ crème brûlée, 日本語 and emoji 🐈 too."
    ids = tokenizer.encode(reply, add_special_tokens=False)
    text = ReplyText(tokenizer)
    out = pieces(text, ids)
    assert "".join(out) == reply
    assert len(out) > 5 and not any("\ufffd" in p for p in out)
    assert text.finish(reply) == ""


def test_a_stop_token_is_not_content(tokenizer: Any) -> None:
    eos = tokenizer.eos_token_id
    text = ReplyText(tokenizer, stop_token_ids={eos})
    out = pieces(text, [*tokenizer.encode("Hi there", add_special_tokens=False), eos])
    assert "".join(out) == "Hi there"


def test_text_that_may_start_a_stop_string_waits(tokenizer: Any) -> None:
    text = ReplyText(tokenizer, stops=("END",))
    sent = "".join(pieces(text, tokenizer.encode("one two EN", add_special_tokens=False)))
    assert sent == "one two "  # "EN" may be the start of "END"
    sent += "".join(pieces(text, tokenizer.encode("D", add_special_tokens=False)))
    assert sent == "one two "  # the reply ends before the stop string
    assert text.finish("one two ") == ""


def test_with_tools_nothing_from_a_tool_call_on_is_content(tokenizer: Any) -> None:
    reply = 'Let me check. <tool_call>{"name": "f", "arguments": {}}</tool_call>'
    text = ReplyText(tokenizer, parse_tools=True)
    sent = "".join(pieces(text, tokenizer.encode(reply, add_special_tokens=False)))
    assert sent == "Let me check."  # the trailing space waits: kept only if no text follows
    assert text.finish("Let me check. ") == " "


def test_a_prefill_counts_as_reply_text(tokenizer: Any) -> None:
    text = ReplyText(tokenizer, prefill="<tool_call>", parse_tools=True)
    ids = tokenizer.encode('{"name": "f"}</tool_call>', add_special_tokens=False)
    assert pieces(text, ids) == []
    # the calls did not parse: the raw text is the content, sent whole at the end
    raw = '<tool_call>{"name": "f"}</tool_call>'
    assert text.finish(raw) == raw
