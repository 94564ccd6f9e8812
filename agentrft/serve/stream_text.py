"""The text of a streamed choice, released only once it is certain.

`stream=true` sends content as tokens are sampled, but a chunk cannot be taken back, so a
piece goes out only when the finished reply is sure to start with it:
- a token that ends inside a UTF-8 character waits for the rest of the character;
- text that could be the start of a stop string waits: the reply will end before a stop
  string, so it may never be sent;
- with tools parsed, nothing from a `<tool_call>` (or what could be its start) on is
  content, and trailing whitespace waits (a reply with calls keeps it only when no text
  follows them, see `protocol.choice`).
When the choice ends, `finish` sends the rest of the content the non-streamed reply has, so
the pieces join to exactly that content. Incremental decoding decodes a window of recent
tokens rather than the whole reply each time (the way TGI and vLLM do), so that
tokenizers whose decoding of a lone token drops its leading space still join correctly.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from typing import Any

from agentrft.policy.tool_format import OPEN

log = logging.getLogger(__name__)


class ReplyText:
    def __init__(
        self,
        tokenizer: Any,
        *,
        prefill: str = "",
        stops: Sequence[str] = (),
        parse_tools: bool = False,
        stop_token_ids: Collection[int] = (),
    ) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(stops)
        self.parse_tools = parse_tools
        self.stop_token_ids = stop_token_ids
        self.text = prefill  # the decoded reply so far, prefill included
        self.sent = ""  # what has been sent: always a prefix of the final content
        self._tokens: list[int] = []
        self._prefix_at = 0  # start of the decoding window
        self._read_at = 0  # tokens already in `text`

    def add(self, token: int) -> str:
        """Take the next sampled token; the content that became certain (often "")."""
        if token in self.stop_token_ids:
            return ""  # a stop token is not part of the reply
        self._tokens.append(token)
        window = self.tokenizer.decode(
            self._tokens[self._prefix_at : self._read_at], skip_special_tokens=False
        )
        new = self.tokenizer.decode(self._tokens[self._prefix_at :], skip_special_tokens=False)
        if len(new) <= len(window) or new.endswith("\ufffd"):
            return ""  # inside a character (or nothing visible yet)
        self.text += new[len(window) :]
        self._prefix_at, self._read_at = self._read_at, len(self._tokens)
        certain = self.text[: self._certain_end()]
        if len(certain) <= len(self.sent) or not certain.startswith(self.sent):
            return ""
        piece, self.sent = certain[len(self.sent) :], certain
        return piece

    def _certain_end(self) -> int:
        text, end = self.text, len(self.text)
        marks = [*self.stops, OPEN] if self.parse_tools else list(self.stops)
        for mark in marks:
            at = text.find(mark)
            end = min(end, at if at >= 0 else len(text) - _partial_suffix(text, mark))
        if self.parse_tools:
            while end and text[end - 1].isspace():
                end -= 1
        return end

    def finish(self, content: str) -> str:
        """The rest of the final `content` (the non-streamed reply's) after what was sent."""
        if content.startswith(self.sent):
            rest, self.sent = content[len(self.sent) :], content
            return rest
        # only possible when text surrounds tool calls and the reply starts with whitespace
        log.warning("streamed content %r is not a prefix of the reply %r", self.sent, content)
        return ""


def _partial_suffix(text: str, mark: str) -> int:
    """The length of the longest end of `text` that is a proper start of `mark`."""
    for n in range(min(len(mark) - 1, len(text)), 0, -1):
        if text.endswith(mark[:n]):
            return n
    return 0
