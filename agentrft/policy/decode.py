"""A decode step for Llama-family models on a CPU, written out with fused weights.

A decode step runs one token per row through every layer. At a batch of 16 on a 2-core CPU,
transformers' module-by-module forward spent about as long in small operators and Python
(norms, rotary, views, seven separate projections per layer) as in the matmuls that read the
weights. `LlamaDecodeStep` computes the same step with:
- the query, key and value projections as one matmul, and the gate and up projections as
  another (the fused weights vLLM also uses), prepacked for oneDNN where that measures
  faster (`policy.precision`);
- each RMSNorm's weight folded into the matmul after it, and the attention's score scale
  into the query weights (in fp32), so neither costs a pass of its own;
- rotary embeddings applied to queries and keys together;
- attention through `prefill.shared_prefix_attention` (or `decode_attention`), into the
  same KV cache, so prefill, shared prefixes, dropped rows and kept prefixes work unchanged.
The fused copies cost as much memory as the weights they stack.
Results equal transformers' forward within floating-point tolerance (tests compare them).
The prefill and any model this does not recognise keep transformers' forward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from agentrft.policy.precision import PACK_ROWS, use_packing
from agentrft.policy.prefill import (
    current_shared_prefix,
    decode_attention,
    shared_prefix_attention,
)


def _linear(x: torch.Tensor, weight: torch.Tensor, packed: bool) -> torch.Tensor:
    if packed:
        return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
    return F.linear(x, weight)


class LlamaDecodeStep:
    """One decode step (a token per row) of a transformers Llama model (`model_type`
    "llama": SmolLM2, Llama 2/3 and their fine-tunes) without biases. `supports(model)` says
    whether it applies; the fused weights follow the model's weights (rebuilt when one is
    changed in place or replaced)."""

    def __init__(self, model: Any, pack: bool = True) -> None:
        if not self.supports(model):
            raise ValueError(f"{type(model).__name__} is not a bias-free Llama model")
        self.model = model
        cfg = model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.intermediate = cfg.intermediate_size
        self.eps = cfg.rms_norm_eps
        self.layers = len(model.model.layers)
        self.pack = pack
        self._sources = [
            w
            for layer in model.model.layers
            for w in (
                layer.self_attn.q_proj.weight,
                layer.self_attn.k_proj.weight,
                layer.self_attn.v_proj.weight,
                layer.self_attn.o_proj.weight,
                layer.mlp.gate_proj.weight,
                layer.mlp.up_proj.weight,
                layer.mlp.down_proj.weight,
                layer.input_layernorm.weight,
                layer.post_attention_layernorm.weight,
            )
        ] + [model.lm_head.weight, model.model.norm.weight]
        self._stamp: tuple[Any, ...] = ()
        self._layers: list[tuple[torch.Tensor, ...]] = []
        self._head: torch.Tensor | None = None
        self._packed = False

    @staticmethod
    def supports(model: Any) -> bool:
        cfg = getattr(model, "config", None)
        if cfg is None or getattr(cfg, "model_type", None) != "llama":
            return False
        if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
            return False
        if getattr(cfg, "hidden_act", None) != "silu" or getattr(cfg, "pretraining_tp", 1) > 1:
            return False
        try:
            layers = list(model.model.layers)
            linears = [model.lm_head] + [
                m
                for layer in layers
                for m in (
                    layer.self_attn.q_proj,
                    layer.self_attn.k_proj,
                    layer.self_attn.v_proj,
                    layer.self_attn.o_proj,
                    layer.mlp.gate_proj,
                    layer.mlp.up_proj,
                    layer.mlp.down_proj,
                )
            ]
        except AttributeError:
            return False
        # an adapter-wrapped projection (LoRA) is not a plain Linear: its forward adds a delta
        return bool(layers) and all(
            isinstance(m, torch.nn.Linear) and m.bias is None for m in linears
        )

    def invalidate(self) -> None:
        self._stamp = ()

    def _weights(self) -> tuple[list[tuple[torch.Tensor, ...]], torch.Tensor]:
        stamp = (self.pack, *((w._version, w.data_ptr(), w.dtype) for w in self._sources))
        if stamp != self._stamp or self._head is None:
            dtype = self._sources[0].dtype
            self._packed = (
                self.pack and self._sources[0].device.type == "cpu" and use_packing(dtype)
            )

            def prep(*weights: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
                """Weights stacked into one matmul; `scale` (a norm's weight, applied to the
                input) folded into their columns, in fp32, so the norm needs no multiply."""
                w = torch.cat([x.float() for x in weights]) if len(weights) > 1 else weights[0]
                if scale is not None:
                    w = w.float() * scale.float()
                w = w.detach().to(dtype).contiguous()
                return torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS) if self._packed else w

            self._layers = []
            for layer in self.model.model.layers:
                attn, mlp = layer.self_attn, layer.mlp
                self._layers.append(
                    (
                        prep(  # the attention's score scaling folded into the queries
                            attn.q_proj.weight.float() * attn.scaling,
                            attn.k_proj.weight,
                            attn.v_proj.weight,
                            scale=layer.input_layernorm.weight,
                        ),
                        prep(attn.o_proj.weight),
                        prep(
                            mlp.gate_proj.weight,
                            mlp.up_proj.weight,
                            scale=layer.post_attention_layernorm.weight,
                        ),
                        prep(mlp.down_proj.weight),
                    )
                )
            self._head = prep(self.model.lm_head.weight, scale=self.model.model.norm.weight)
            self._stamp = stamp
        assert self._head is not None
        return self._layers, self._head

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm without its weight (folded into the next matmul), in fp32 as transformers
        computes it, back in the model's dtype."""
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).to(x.dtype)

    @torch.no_grad()
    def __call__(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, kv: Any
    ) -> torch.Tensor:
        """The next-token logits (`[rows, vocab]`) after one token per row (`ids` `[rows,
        1]`), at `positions` `[rows, 1]`, attending over `kv` plus itself under `mask`
        `[rows, columns]` (1 where a real token is); appends to `kv`."""
        if ids.shape[1] != 1 or len(kv.layers) != self.layers:
            raise ValueError("a decode step takes one token per row and a prefilled cache")
        layers, head = self._weights()
        packed = self._packed
        rows = ids.shape[0]
        nh, nkv, hd, inter = self.heads, self.kv_heads, self.head_dim, self.intermediate
        base = self.model.model
        x = base.embed_tokens(ids[:, 0])
        cos, sin = base.rotary_emb(x[:, None], positions)  # [rows, 1, head_dim]
        cos = cos.to(x.dtype)
        half = hd // 2
        # rotate_half(t) * sin == flip-halves(t) * [-sin_first_half, sin_second_half]
        sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1).to(x.dtype)
        attend = None if bool(mask.all()) else mask[:, None, None, :].bool()
        shared = current_shared_prefix() if nh != nkv else None
        scale = 1.0  # folded into the query weights
        for i, (w_qkv, w_o, w_gate_up, w_down) in enumerate(layers):
            qkv = _linear(self._norm(x), w_qkv, packed)
            qk = qkv[:, : (nh + nkv) * hd].view(rows, nh + nkv, hd)
            flipped = qk.view(rows, nh + nkv, 2, half).flip(2).view(rows, nh + nkv, hd)
            qk = qk * cos + flipped * sin
            k = qk[:, nh:, None, :]  # [rows, kv heads, 1 token, dim]
            v = qkv[:, (nh + nkv) * hd :].view(rows, nkv, 1, hd)
            keys, values = kv.layers[i].update(k, v)
            module = base.layers[i].self_attn
            if shared is not None and shared.width < keys.shape[2]:
                # queries packed onto their key/value heads: [rows, kv heads, per kv, dim]
                q = qk[:, :nh].view(rows, nkv, nh // nkv, hd)
                out = shared_prefix_attention(shared, module, q, keys, values, attend, scale)
            else:
                out, _ = decode_attention(
                    module, qk[:, :nh, None, :], keys, values, attend, scaling=scale, dropout=0.0
                )
            x = x + _linear(out.reshape(rows, nh * hd), w_o, packed)
            gate_up = _linear(self._norm(x), w_gate_up, packed)
            x = x + _linear(F.silu(gate_up[:, :inter]) * gate_up[:, inter:], w_down, packed)
        return _linear(self._norm(x), head, packed)
