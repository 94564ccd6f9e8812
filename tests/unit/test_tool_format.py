"""The tool-call parser: several calls, malformed JSON, unknown tools, schema violations,
and property-based checks over arbitrary and adversarial model output."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrft.policy.tool_format import CLOSE, OPEN, parse_reply

SCHEMAS = {
    "grep": {
        "type": "object",
        "properties": {"pattern": {"type": "string"}, "max": {"type": "integer"}},
        "required": ["pattern"],
        "additionalProperties": False,
    },
    "read_file": {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    },
}


def test_plain_text_is_a_final_answer():
    r = parse_reply("The answer is 42.", SCHEMAS)
    assert r.is_final and r.text == "The answer is 42."


def test_several_calls_in_one_reply_keep_their_order():
    r = parse_reply(
        'Let me look.\n<tool_call>{"name": "grep", "arguments": {"pattern": "auth"}}</tool_call>\n'
        '<tool_call>{"name": "read_file", "arguments": {"path": "a.py"}}</tool_call>',
        SCHEMAS,
    )
    assert [c.name for c in r.calls] == ["grep", "read_file"]
    assert all(c.error is None for c in r.calls)
    assert json.loads(r.calls[0].arguments) == {"pattern": "auth"}
    assert r.text == "Let me look."
    assert len({c.call_id for c in r.calls}) == 2 and all(
        c.call_id.startswith("call_") and c.id.startswith("fc_") for c in r.calls
    )


def test_arguments_as_json_string_are_accepted():
    r = parse_reply(
        '<tool_call>{"name": "grep", "arguments": "{\\"pattern\\": \\"x\\"}"}</tool_call>', SCHEMAS
    )
    assert r.calls[0].error is None and json.loads(r.calls[0].arguments) == {"pattern": "x"}


def test_unterminated_last_call_is_still_read():
    r = parse_reply('<tool_call>{"name": "grep", "arguments": {"pattern": "x"}}', SCHEMAS)
    assert r.calls[0].error is None


def test_errors_say_exactly_what_was_wrong():
    cases = {
        '<tool_call>{"name": "grep", "arguments": {"pattern": "x"}</tool_call>': "not valid JSON",
        '<tool_call>["grep"]</tool_call>': "must be a JSON object",
        '<tool_call>{"arguments": {}}</tool_call>': 'has no "name"',
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call>': "unknown tool 'rm'. Available tools: grep, read_file",
        '<tool_call>{"name": "grep", "arguments": {}}</tool_call>': "'pattern' is a required property",
        '<tool_call>{"name": "grep", "arguments": {"pattern": 1}}</tool_call>': "invalid arguments for 'grep' at pattern: 1 is not of type 'string'",
        '<tool_call>{"name": "grep", "arguments": {"pattern": "x", "bogus": 1}}</tool_call>': "Additional properties are not allowed",
        '<tool_call>{"name": "grep", "arguments": [1]}</tool_call>': "must be a JSON object",
        '<tool_call>{"name": "grep", "arguments": {"pattern": "x"}, "id": 3}</tool_call>': "unexpected key(s) ['id']",
        'oops {"name": "grep"}</tool_call>': "without a matching <tool_call>",
    }
    for text, expected in cases.items():
        r = parse_reply(text, SCHEMAS)
        assert len(r.calls) == 1, text
        assert r.calls[0].error is not None and expected in r.calls[0].error, (
            text,
            r.calls[0].error,
        )
        assert not r.is_final  # an attempted call is never mistaken for an answer


def test_deeply_nested_json_does_not_crash():
    r = parse_reply(OPEN + "[" * 100000 + CLOSE, SCHEMAS)
    assert r.calls[0].error


_pieces = st.sampled_from(
    list('{}[]":,<>/ \n\\abcxyz_01')
    + [
        OPEN,
        CLOSE,
        '"name"',
        '"arguments"',
        '"grep"',
        '"pattern"',
        '{"name": "grep", "arguments": {"pattern": "a"}}',
    ]
)
_texty = st.lists(_pieces, max_size=60).map("".join)


@settings(max_examples=2000, deadline=None)
@given(_texty)
def test_never_raises_and_never_drops_an_attempted_call(text):
    r = parse_reply(text, SCHEMAS)
    # every opening tag yields a call record (valid or not), unless it sits inside the
    # JSON of a call, as part of an argument string
    inside = sum(c.arguments.count(OPEN) for c in r.calls)
    assert len(r.calls) >= text.count(OPEN) - inside
    for c in r.calls:
        assert (c.error is None) == (c.name in SCHEMAS and c.error is None)
        if c.error is None:
            assert isinstance(json.loads(c.arguments), dict)
    if not r.calls:
        assert OPEN not in text and CLOSE not in text


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["grep", "read_file"]), st.text(max_size=30)),
        min_size=1,
        max_size=5,
    ),
    st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=50),
)
def test_valid_calls_round_trip(calls, prose):
    key = {"grep": "pattern", "read_file": "path"}
    text = prose + "".join(
        OPEN + json.dumps({"name": n, "arguments": {key[n]: v}}) + CLOSE for n, v in calls
    )
    r = parse_reply(text, SCHEMAS)
    assert [(c.name, json.loads(c.arguments)[key[c.name]]) for c in r.calls] == calls
    assert all(c.error is None for c in r.calls)
    assert r.text == prose.strip()
