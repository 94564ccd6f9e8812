"""Grammar-constrained tool calls: a reply that must be (or may contain) schema-valid calls.

A `ToolCallGrammar` says what the sampled part of a reply (after any prefill) may be, as an
xgrammar structural tag: the JSON that xgrammar compiles into a token mask and that vLLM's
structured outputs take as they are (`structural_tag`), so every engine can enforce it. It
travels in `SamplingParams.constraint`; `policy.row_state` applies its mask at every step.

Three shapes, all in agentrft's `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
format (`policy.tool_format`):
- `required`: exactly one call to one of the tools, then the reply ends;
- `named`: one call to that tool, then the reply ends;
- `auto`: free text, but once `<tool_call>` is written the call must be valid (OpenAI's
  `strict: true`; rollouts with `agentrft.sampling.constrained_tool_calls`).
`inside_call` says the prefill already wrote the opening of the call (`<tool_call>` for
`required`, up to the arguments for `named`), so the grammar starts after it.
The arguments are compiled in xgrammar's strict mode: a property the schema does not name is
never generated, even where the schema leaves `additionalProperties` open (the 135M model's
free calls add such keys, which tools then refuse: bench/RESULTS.md section 10).

Cost on the 135M model's tokenizer (2-core AMD EPYC, AVX2, shared): the tokenizer table is
built once per tokenizer (about 1.3 s), a grammar compiles in about 50 ms, and a mask costs
a few microseconds per row per step.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from agentrft.policy.tool_format import CLOSE, OPEN

if TYPE_CHECKING:
    import torch

Mode = Literal["auto", "required", "named"]
MAX_WHITESPACE = 4  # a small model can emit whitespace forever inside JSON; cap each run


class ConstraintError(ValueError):
    """A tool schema the grammar compiler cannot enforce (the message says which)."""


@dataclass(frozen=True, eq=False)
class ToolCallGrammar:
    """What the sampled part of a reply must match. Compared by identity, so rows that share
    one grammar batch together (`rollout.batching` groups equal params)."""

    structural_tag: Mapping[str, Any]  # {"type": "structural_tag", "format": {...}}
    # text of the reply already written (a prefill) that each row's matcher accepts first, so
    # the grammar holds what is sampled after it; "" for a reply that starts with the sampling
    prefix: str = ""
    _compiled: dict[int, Any] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _after: dict[str, ToolCallGrammar] = field(default_factory=dict, repr=False)

    def after(self, prefix: str) -> ToolCallGrammar:
        """This grammar for a reply that starts with `prefix` (a prefill, which may open a
        call: `<tool_call>{"name": "apply", "arguments": {"candidate": `). The same object
        for the same prefix, so its rows batch together; the compiled grammar is shared."""
        if not prefix:
            return self
        with self._lock:
            if prefix not in self._after:
                self._after[prefix] = ToolCallGrammar(
                    self.structural_tag, self.prefix + prefix, self._compiled, self._lock
                )
            return self._after[prefix]

    def compiled(self, tokenizer: Any, vocab_size: int, stop_token_ids: frozenset[int]) -> Any:
        """The xgrammar CompiledGrammar for `tokenizer` (compiled once, then kept)."""
        key = id(compiler_for(tokenizer, vocab_size, stop_token_ids))
        with self._lock:
            if key not in self._compiled:
                compiler = compiler_for(tokenizer, vocab_size, stop_token_ids)
                try:
                    self._compiled[key] = compiler.compile_structural_tag(
                        json.dumps(self.structural_tag)
                    )
                except (RuntimeError, ValueError) as exc:
                    raise ConstraintError(f"the tool schemas cannot be enforced: {exc}") from None
            return self._compiled[key]

    def matcher(self, tokenizer: Any, vocab_size: int, stop_token_ids: frozenset[int]) -> Any:
        """A fresh xgrammar GrammarMatcher for one row."""
        import xgrammar

        matcher = xgrammar.GrammarMatcher(
            self.compiled(tokenizer, vocab_size, stop_token_ids),
            override_stop_tokens=sorted(stop_token_ids),
        )
        if self.prefix and not matcher.accept_string(self.prefix):
            raise ConstraintError(
                f"the reply's prefill {self.prefix!r} does not fit the tool-call grammar (a "
                "call opened there must name a tool and follow its schema); fix the prefill "
                "or turn agentrft.sampling.constrained_tool_calls off"
            )
        return matcher


@functools.lru_cache(maxsize=8)
def _compiler(tokenizer: Any, vocab_size: int, stop_token_ids: frozenset[int]) -> Any:
    import xgrammar

    info = xgrammar.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab_size, stop_token_ids=sorted(stop_token_ids)
    )
    return xgrammar.GrammarCompiler(info, max_threads=1)


def compiler_for(tokenizer: Any, vocab_size: int, stop_token_ids: frozenset[int]) -> Any:
    """One xgrammar GrammarCompiler per tokenizer (its table takes about a second to build)."""
    return _compiler(tokenizer, vocab_size, stop_token_ids)


def call_opening(name: str) -> str:
    """The text of a call to `name` up to its arguments, as `tool_format.render_call` writes it."""
    return '{"name": ' + json.dumps(name) + ', "arguments": '


def tool_call_grammar(
    tools: Sequence[tuple[str, Mapping[str, Any]]],
    mode: Mode,
    *,
    name: str | None = None,
    inside_call: bool = False,
) -> ToolCallGrammar:
    """The grammar of a reply given the tools' (name, JSON schema) pairs. `name`: the tool
    of a `named` choice. `inside_call`: the prefill already opened the call (see the module)."""
    if not tools:
        raise ValueError("a tool-call grammar needs at least one tool")

    def args(schema: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "type": "json_schema",
            "json_schema": dict(schema),
            "max_whitespace_cnt": MAX_WHITESPACE,
        }

    def call(tool: str, schema: Mapping[str, Any], opened: bool) -> dict[str, Any]:
        begin = ("" if opened else OPEN) + call_opening(tool)
        return {"type": "tag", "begin": begin, "content": args(schema), "end": "}" + CLOSE}

    if mode == "named":
        schema = dict(tools).get(str(name))
        if schema is None:
            raise ValueError(f"tool {name!r} is not among the tools")
        fmt: dict[str, Any] = (
            {
                "type": "sequence",
                "elements": [args(schema), {"type": "const_string", "value": "}" + CLOSE}],
            }
            if inside_call
            else call(str(name), schema, False)
        )
    elif mode == "required":
        fmt = {"type": "or", "elements": [call(t, s, inside_call) for t, s in tools]}
    else:
        triggered = {
            "type": "triggered_tags",
            "triggers": [OPEN],
            "tags": [call(t, s, False) for t, s in tools],
        }
        fmt = (
            {
                "type": "sequence",
                "elements": [
                    {"type": "or", "elements": [call(t, s, True) for t, s in tools]},
                    triggered,
                ],
            }
            if inside_call
            else triggered
        )
    return ToolCallGrammar({"type": "structural_tag", "format": fmt})


def apply_grammars(
    logits: torch.Tensor, rows: Sequence[tuple[int, Any]], bitmask: torch.Tensor | None
) -> torch.Tensor:
    """Set to -inf, in place, every logit that row j's matcher does not allow, for each
    (j, matcher) in `rows`. `bitmask`: a buffer from an earlier call, reused when it is big
    enough; the buffer used is returned."""
    import xgrammar

    need = (logits.shape[0], (logits.shape[-1] + 31) // 32)
    if bitmask is None or bitmask.shape[0] < need[0] or bitmask.shape[1] != need[1]:
        bitmask = xgrammar.allocate_token_bitmask(need[0], logits.shape[-1])
    for j, matcher in rows:
        matcher.fill_next_token_bitmask(bitmask, j)
    xgrammar.apply_token_bitmask_inplace(
        logits, bitmask[: need[0]], vocab_size=logits.shape[-1], indices=[j for j, _ in rows]
    )
    return bitmask
