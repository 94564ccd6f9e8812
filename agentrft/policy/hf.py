"""Local transformers policy: load a model, sample batches with a KV cache, report log-probs.

The sampling loop is written out (rather than `model.generate`) because the rollout engine
needs three things generate does not give cheaply together: per-row token limits, the exact
log-probability of every sampled token under the sampling distribution, and stopping rows
independently while the rest of the batch continues.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from agentrft.policy import Completion, SamplingParams
from agentrft.policy.models import resolve_model

log = logging.getLogger(__name__)


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


class HFPolicy:
    """A causal LM from transformers, with fp32 master weights and optional bf16 autocast."""

    def __init__(self, model: Any, tokenizer: Any, dtype: str = "bf16", name: str = "") -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.dtype = dtype
        self.name = name
        self.device = next(model.parameters()).device
        eos = {tokenizer.eos_token_id}
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        eos |= set(gen_eos) if isinstance(gen_eos, list) else {gen_eos}
        self.stop_token_ids = frozenset(int(t) for t in eos if t is not None)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.stop_token_ids)
        self.context_window = int(getattr(model.config, "max_position_embeddings", 2048))

    @classmethod
    def load(cls, name_or_path: str, device: str = "auto", dtype: str = "bf16", for_training: bool = False) -> HFPolicy:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path: Path = resolve_model(name_or_path)
        t0 = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        model.to(pick_device(device)).eval()
        log.info("loaded %s in %.1fs", path, time.perf_counter() - t0)
        return cls(model, tokenizer, dtype=dtype, name=name_or_path)

    def sync_sampler(self) -> None:
        """Make sampling see the latest weights (after an update)."""

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """bf16 autocast over fp32 weights (the CPU here has bf16 matrix units), or nothing."""
        if self.dtype == "bf16":
            with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16):
                yield
        else:
            yield

    @torch.no_grad()
    def sample(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        max_tokens: Sequence[int] | None = None,
        seeds: Sequence[int] | None = None,
    ) -> list[Completion]:
        if not prompts:
            return []
        limits = [min(params.max_tokens, m) for m in max_tokens] if max_tokens is not None else [params.max_tokens] * len(prompts)
        if any(m < 1 for m in limits):
            raise ValueError("every row needs max_tokens >= 1")
        B, dev = len(prompts), self.device
        width = max(len(p) for p in prompts)
        ids = torch.full((B, width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((B, width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every row's last token is at -1
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        if seeds is None:
            base = params.seed if params.seed is not None else int(torch.randint(0, 2**62, ()).item())
            seeds = [base + i for i in range(B)]
        gens = [torch.Generator(device=dev).manual_seed(int(s) % 2**63) for s in seeds]
        limit_t = torch.tensor(limits, device=dev)
        stop_t = torch.tensor(sorted(self.stop_token_ids), device=dev)

        from transformers import DynamicCache

        cache = DynamicCache()
        out_tokens: list[torch.Tensor] = []
        out_logps: list[torch.Tensor] = []
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        lengths = torch.zeros(B, dtype=torch.long, device=dev)
        stopped = torch.zeros(B, dtype=torch.bool, device=dev)
        stop_strings: list[str] = [""] * B
        tail = max((len(self.tokenizer.encode(s, add_special_tokens=False)) for s in params.stop), default=0) + 2
        step_ids, step_pos = ids, positions
        with self.autocast():
            for _ in range(max(limits)):
                logits = self.model(
                    input_ids=step_ids, attention_mask=mask, position_ids=step_pos,
                    cache=cache, use_cache=True, logits_to_keep=1,
                ).logits[:, -1, :].float()
                tok, logp = _choose(logits, params, gens)
                tok = torch.where(done, torch.full_like(tok, self.pad_token_id), tok)
                out_tokens.append(tok)
                out_logps.append(logp)
                lengths += (~done).long()
                hit_stop = torch.isin(tok, stop_t) & ~done
                if params.stop:
                    for i in (~done & ~hit_stop).nonzero().flatten().tolist():
                        recent = self.tokenizer.decode(torch.stack(out_tokens[-tail:], 1)[i].tolist())
                        matched = next((s for s in params.stop if s in recent), None)
                        if matched is not None:
                            stop_strings[i] = matched
                            hit_stop[i] = True
                stopped |= hit_stop
                done |= hit_stop | (lengths >= limit_t)
                if bool(done.all()):
                    break
                mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=dev)], dim=1)
                step_ids = tok[:, None]
                step_pos = step_pos[:, -1:] + 1
        toks = torch.stack(out_tokens, 1).tolist()
        lps = torch.stack(out_logps, 1).tolist()
        result = []
        for i in range(B):
            n = int(lengths[i])
            result.append(Completion(tuple(toks[i][:n]), tuple(lps[i][:n]), "stop" if bool(stopped[i]) else "length", stop_strings[i]))
        return result


def _choose(logits: torch.Tensor, params: SamplingParams, gens: Sequence[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick the next token per row; return it and its log-prob under the sampling
    distribution (softmax of logits / temperature, before top-p truncation).

    Sampling is Gumbel-max with each row's own generator: argmax(logits/T + Gumbel noise)
    draws from softmax(logits/T), and a row's draw never depends on its batch-mates."""
    if params.temperature <= 0:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logits.argmax(dim=-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
    logp = torch.log_softmax(logits / params.temperature, dim=-1)
    scores = logp
    if params.top_p < 1.0:
        sorted_lp, order = logp.sort(dim=-1, descending=True)
        sorted_p = sorted_lp.exp()
        drop = sorted_p.cumsum(-1) - sorted_p >= params.top_p  # always keeps the top token
        scores = logp.scatter(-1, order, sorted_lp.masked_fill(drop, float("-inf")))
    uniform = torch.stack([torch.rand(logits.shape[-1], generator=g, device=logits.device) for g in gens])
    gumbel = -torch.log(-torch.log(uniform.clamp_min(1e-20)))
    tok = (scores + gumbel).argmax(dim=-1)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
