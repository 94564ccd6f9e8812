"""Local transformers policy: load a model, sample batches with a KV cache, report log-probs.

The sampling loop is written out (rather than `model.generate`) because the rollout engine
needs three things generate does not give cheaply together: per-row token limits, the exact
log-probability of every sampled token under the sampling distribution, and stopping rows
independently while the rest of the batch continues.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import torch

from agentrft.policy import Completion, SamplingParams
from agentrft.policy.decode import LlamaDecodeStep
from agentrft.policy.kv_cache import PrefixCache
from agentrft.policy.models import resolve_model
from agentrft.policy.precision import (
    DtypeChoice,
    PackedLinears,
    bf16_autocast,
    resolve_dtype,
    use_packing,
)
from agentrft.policy.prefill import (
    SharedPrefix,
    prefill_prompts,
    prefill_suffixes,
    row_prefix,
    shared_prefix,
    stack,
    use_decode_attention,
)
from agentrft.policy.row_state import RowRules, RowState

log = logging.getLogger(__name__)


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def stop_tokens(tokenizer: Any, generation_config: Any) -> frozenset[int]:
    """The ids that end a reply: the tokenizer's EOS and the generation config's."""
    eos = {tokenizer.eos_token_id}
    gen_eos = getattr(generation_config, "eos_token_id", None)
    eos |= set(gen_eos) if isinstance(gen_eos, list) else {gen_eos}
    return frozenset(int(t) for t in eos if t is not None)


class HFPolicy:
    """A causal LM from transformers that samples batches with a KV cache.

    For inference the weights are held in the sampling dtype (`auto`: bf16 where the hardware
    computes it natively, else fp32; see `policy.precision`). For training
    (`for_training=True`) `model` keeps fp32 master weights for the optimiser, and sampling
    runs on a separate copy in the sampling dtype with any LoRA adapter merged in, refreshed
    by `sync_sampler()` after each update: no per-token autocast casts and no LoRA detour
    while decoding (what vLLM's weight sync does on GPUs). On a CPU where it measures faster,
    the sampling model's matmuls read weights prepacked for oneDNN (`policy.precision`); set
    `pack_linears = False` to sample on the plain weights.
    """

    keeps_kv_cache = True  # `sample` takes a PrefixCache (rollout.batching passes one)

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        dtype: str = "fp32",
        name: str = "",
        sampler: Any = None,
        precision: DtypeChoice | None = None,
    ) -> None:
        self.model = model
        self.sampler_model = sampler if sampler is not None else model
        use_decode_attention(self.sampler_model)
        self.tokenizer = tokenizer
        self.precision = precision or resolve_dtype(dtype, next(model.parameters()).device.type)
        self.dtype = self.precision.dtype  # "bf16" or "fp32", never "auto"
        self.name = name
        self.device = next(model.parameters()).device
        self.stop_token_ids = stop_tokens(tokenizer, getattr(model, "generation_config", None))
        self.pad_token_id = (
            tokenizer.pad_token_id
            if tokenizer.pad_token_id is not None
            else min(self.stop_token_ids)
        )
        self.context_window = int(getattr(model.config, "max_position_embeddings", 2048))
        self.pack_linears = True
        self._packs: PackedLinears | None = None
        self._rules: RowRules | None = None
        self.decode_step: LlamaDecodeStep | None = (
            LlamaDecodeStep(self.sampler_model)
            if self.device.type == "cpu" and LlamaDecodeStep.supports(self.sampler_model)
            else None
        )

    @classmethod
    def for_inference(
        cls, model: Any, tokenizer: Any, dtype: str = "auto", name: str = ""
    ) -> HFPolicy:
        """Wrap a loaded model for sampling only: weights cast once to the sampling dtype."""
        precision = resolve_dtype(dtype, next(model.parameters()).device.type)
        if precision.dtype == "bf16":
            model = model.to(torch.bfloat16)
        return cls(model.eval(), tokenizer, name=name, precision=precision)

    @classmethod
    def load(
        cls,
        name_or_path: str,
        device: str = "auto",
        dtype: str = "auto",
        for_training: bool = False,
        sampling_copy: bool = True,
    ) -> HFPolicy:
        """`for_training`: fp32 master weights, sampled through a copy in the sampling dtype
        (`sampling_copy`; off when another engine samples, so the weights are held once)."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path: Path = resolve_model(name_or_path)
        t0 = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(path)
        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        model.to(pick_device(device)).eval()
        log.info("loaded %s in %.1fs", path, time.perf_counter() - t0)
        if not for_training:
            return cls.for_inference(model, tokenizer, dtype=dtype, name=name_or_path)
        precision = resolve_dtype(dtype, next(model.parameters()).device.type)
        if not sampling_copy:
            return cls(model, tokenizer, name=name_or_path, precision=precision)
        sampler = (
            copy.deepcopy(model)
            .to(torch.bfloat16 if precision.dtype == "bf16" else torch.float32)
            .eval()
        )
        sampler.requires_grad_(False)
        return cls(model, tokenizer, name=name_or_path, sampler=sampler, precision=precision)

    @torch.no_grad()
    def sync_sampler(self) -> None:
        """Copy the trained weights into the sampling copy (LoRA deltas merged in). Call it
        after every optimiser step; a no-op when sampling uses `model` itself."""
        if self.sampler_model is self.model:
            return
        target = dict(self.sampler_model.named_parameters())
        if hasattr(self.model, "peft_config"):
            from peft.tuners.lora import LoraLayer

            base = self.model.get_base_model()
            for name, module in base.named_modules():
                if isinstance(module, LoraLayer) and hasattr(module, "base_layer"):
                    weight = module.base_layer.weight
                    for adapter in module.active_adapters:
                        weight = weight + module.get_delta_weight(adapter)  # type: ignore[attr-defined]  # on peft's Linear
                    target[f"{name}.weight"].copy_(weight)
        else:
            for name, p in self.model.named_parameters():
                target[name].copy_(p)
        if self._packs is not None:
            self._packs.invalidate()
        if self.decode_step is not None:
            self.decode_step.invalidate()

    def _needs_autocast(self) -> bool:
        return self.dtype == "bf16" and next(self.sampler_model.parameters()).dtype == torch.float32

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast when bf16 is asked for but the sampling weights are fp32."""
        return bf16_autocast(self._needs_autocast(), self.device)

    def packed_linears(self) -> PackedLinears | None:
        """The sampling model's prepacked weights, made at first use on a CPU where
        `use_packing` says so (measured faster, pinned by a resumed run, or set by hand)."""
        if not self.pack_linears or self.device.type != "cpu":
            return None
        if self._packs is None:
            dtype = next(self.sampler_model.parameters()).dtype
            if not use_packing(dtype):
                log.info("sampler matmuls on plain weights")
                self.pack_linears = False
                return None
            log.info("sampler matmuls on weights prepacked for oneDNN")
            self._packs = PackedLinears(self.sampler_model)
        return self._packs

    @torch.no_grad()
    def forward_last(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, kv: Any
    ) -> torch.Tensor:
        """One forward pass of the sampling model over `ids`, extending the KV cache `kv`:
        the next-token logits of each row (`[rows, vocab]`, in the model's dtype). A decode
        step (one token per row) runs through `decode_step` where the model has one."""
        if (
            self.decode_step is not None
            and ids.shape[1] == 1
            and len(getattr(kv, "layers", ())) == self.decode_step.layers  # not a 1-token prefill
            and not self._needs_autocast()
        ):
            self.decode_step.pack = self.pack_linears
            return self.decode_step(ids, mask, positions, kv)
        packs = self.packed_linears()
        with self.autocast(), packs.active() if packs is not None else contextlib.nullcontext():
            return self.sampler_model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                cache=kv,
                use_cache=True,
                logits_to_keep=1,
            ).logits[:, -1, :]

    @torch.no_grad()
    def sample(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        max_tokens: Sequence[int] | None = None,
        seeds: Sequence[int] | None = None,
        cache: PrefixCache | None = None,
        cache_keys: Sequence[Hashable | None] | None = None,
    ) -> list[Completion]:
        """Identical prompts (a group's first turn) are prefilled once and their KV cache
        shared; rows that finish are dropped from the batch as it goes.

        With a `cache` and a key per row (a rollout's trace id), a row whose key has a kept
        prefix of its prompt prefills only the rest, and every keyed row leaves its KV cache
        in `cache` for its next turn (see `policy.kv_cache`)."""
        if not prompts:
            return []
        B, dev = len(prompts), self.device
        limits = (
            [min(params.max_tokens, m) for m in max_tokens]
            if max_tokens is not None
            else [params.max_tokens] * B
        )
        if any(m < 1 for m in limits):
            raise ValueError("every row needs max_tokens >= 1")
        if seeds is None:
            base = (
                params.seed if params.seed is not None else int(torch.randint(0, 2**62, ()).item())
            )
            seeds = [base + i for i in range(B)]
        gens = [torch.Generator(device=dev).manual_seed(int(s) % 2**63) for s in seeds]
        forward = self.forward_last

        keys: list[Hashable | None] = (
            list(cache_keys) if cache is not None and cache_keys is not None else [None] * B
        )
        found = [
            cache.take(k, p) if cache is not None and k is not None else None
            for k, p in zip(keys, prompts, strict=True)
        ]
        fresh = [i for i in range(B) if found[i] is None]
        extended = [i for i in range(B) if found[i] is not None]
        parts = []
        if fresh:
            parts.append(
                prefill_prompts(
                    forward, [prompts[i] for i in fresh], self.pad_token_id, dev, max(limits)
                )
            )
        if extended:
            parts.append(
                prefill_suffixes(
                    forward,
                    [e for e in found if e is not None],
                    [prompts[i] for i in extended],
                    self.pad_token_id,
                    dev,
                    max(limits),
                )
            )
        batch = stack(parts, max(limits))
        if cache is not None:
            cache.stats.prefill_tokens += batch.tokens
            cache.stats.reused_tokens += sum(len(e.tokens) for e in found if e is not None)
        kv, logits, mask, last_pos = batch.cache, batch.logits, batch.mask, batch.last_pos
        prompt_of = list(batch.prompt_of)  # rows sharing a prompt read its keys and values once
        shared = SharedPrefix.of(prompt_of, batch.shared_width)

        rules = self.row_rules()
        rows = [rules.start(RowState(params, limits[i])) for i in range(B)]
        live = fresh + extended  # original row of each batch row
        while True:
            live_rows = [rows[i] for i in live]
            masking = rules.mask(logits, live_rows)
            tok, logp = _choose(logits, params, [gens[i] for i in live])
            rules.record(live_rows, tok, logp, masking)
            keep = [j for j, i in enumerate(live) if rows[i].finish_reason is None]
            if (
                cache is not None and cache.max_bytes > 0
            ):  # a finished row's KV is kept for its rollout's next turn
                for j in sorted(set(range(len(live))) - set(keep)):
                    i = live[j]
                    entry = (
                        row_prefix(kv, mask, j, [*prompts[i], *rows[i].tokens[:-1]])
                        if keys[i] is not None
                        else None
                    )
                    if entry is not None:
                        cache.put(keys[i], entry)
            if not keep:
                break
            if len(keep) < len(live):  # drop finished rows so they cost nothing more
                idx = torch.tensor(keep, device=dev)
                kv.batch_select_indices(idx)
                tok, mask, last_pos = tok[idx], mask[idx], last_pos[idx]
                live = [live[j] for j in keep]
                prompt_of = [prompt_of[j] for j in keep]
                shared = SharedPrefix.of(prompt_of, batch.shared_width)
            mask = torch.cat(
                [mask, torch.ones((len(live), 1), dtype=mask.dtype, device=dev)], dim=1
            )
            last_pos = last_pos + 1
            with shared_prefix(shared):
                logits = forward(tok[:, None], mask, last_pos, kv).float()
        return [row.completion() for row in rows]

    def row_rules(self) -> RowRules:
        """How this policy's rows stop and what they may sample (`policy.row_state`)."""
        if self._rules is None:
            vocab = int(getattr(self.sampler_model.config, "vocab_size", len(self.tokenizer)))
            self._rules = RowRules(self.tokenizer, self.stop_token_ids, vocab, self.device)
        return self._rules


def choose_rows(
    logits: torch.Tensor, params: Sequence[SamplingParams], gens: Sequence[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """`_choose` where each row has its own temperature and top-p (the serving scheduler's
    batch mixes requests): rows that share them are chosen together."""
    groups: dict[tuple[float, float], list[int]] = {}
    for row, p in enumerate(params):
        groups.setdefault((p.temperature, p.top_p), []).append(row)
    if len(groups) == 1:
        return _choose(logits, params[0], gens)
    tok = torch.empty(len(params), dtype=torch.long, device=logits.device)
    logp = torch.empty(len(params), dtype=logits.dtype, device=logits.device)
    for rows in groups.values():
        idx = torch.tensor(rows, device=logits.device)
        t, lp = _choose(logits[idx], params[rows[0]], [gens[r] for r in rows])
        tok[idx], logp[idx] = t, lp
    return tok, logp


def _choose(
    logits: torch.Tensor, params: SamplingParams, gens: Sequence[torch.Generator]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the next token per row; return it and its log-prob under the sampling
    distribution (softmax of logits / temperature, before top-p truncation).

    Each row draws one uniform number from its own generator, so its sample never depends on
    its batch-mates, and takes the token where it falls in the row's cumulative distribution
    (summed in fp64). One number per row, not one per vocabulary entry: at a 49k vocabulary
    and 16 rows, drawing a number per entry (the Gumbel-max form) cost 4 ms a step."""
    if params.temperature <= 0:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logits.argmax(dim=-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
    scaled = logits if params.temperature == 1.0 else logits / params.temperature  # a pass fewer
    logp = torch.log_softmax(scaled, dim=-1)
    probs = logp.exp()
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p >= params.top_p  # always keeps the top token
        probs = probs.scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    cdf = probs.to(torch.float64).cumsum_(-1)
    # 1 - u is in (0, 1]: the first entry whose running sum reaches it has probability > 0
    u = torch.cat([torch.rand(1, generator=g, dtype=torch.float64, device=g.device) for g in gens])
    tok = torch.searchsorted(cdf, ((1.0 - u) * cdf[:, -1])[:, None]).squeeze(-1)
    tok = tok.clamp_max_(probs.shape[-1] - 1)  # never past the end, whatever the rounding
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
