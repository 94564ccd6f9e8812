"""`policy.hf._choose`: the next token is drawn from softmax(logits / temperature), cut to
top-p, with one uniform number per row from that row's own generator; its log-prob is under
the untruncated distribution; a row's draw never depends on its batch-mates."""

from __future__ import annotations

import pytest
import torch

from agentrft.policy import SamplingParams
from agentrft.policy.hf import _choose, choose_rows

LOGITS = torch.tensor([0.0, 1.0, 2.0, -1.0, -30.0, 0.5])


def frequencies(params: SamplingParams, draws: int = 20_000) -> torch.Tensor:
    gens = [torch.Generator().manual_seed(i) for i in range(draws)]
    tok, _ = _choose(LOGITS.expand(draws, -1).clone(), params, gens)
    return torch.bincount(tok, minlength=len(LOGITS)).double() / draws


def within_sampling_error(seen: torch.Tensor, expected: torch.Tensor, draws: int = 20_000) -> bool:
    sigma = (expected * (1 - expected) / draws).sqrt()
    return bool(((seen - expected).abs() <= 5 * sigma + 1e-9).all())


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_draws_follow_the_softmax(temperature: float) -> None:
    expected = torch.softmax(LOGITS.double() / temperature, dim=-1)
    seen = frequencies(SamplingParams(temperature=temperature))
    assert within_sampling_error(seen, expected)
    # and the check can fail: the draws are not those of another temperature
    other = torch.softmax(LOGITS.double() / (temperature * 1.5), dim=-1)
    assert not within_sampling_error(seen, other)


def test_top_p_never_draws_a_cut_token_and_renormalises_the_rest() -> None:
    p = torch.softmax(LOGITS.double(), dim=-1)  # top two: 0.56 + 0.21 >= 0.7
    seen = frequencies(SamplingParams(temperature=1.0, top_p=0.7))
    kept = torch.zeros_like(p)
    kept[[2, 1]] = p[[2, 1]]
    assert seen[[0, 3, 4, 5]].sum() == 0
    assert within_sampling_error(seen, kept / kept.sum())


def test_log_probs_are_under_the_untruncated_distribution() -> None:
    gens = [torch.Generator().manual_seed(i) for i in range(50)]
    tok, logp = _choose(LOGITS.expand(50, -1).clone(), SamplingParams(top_p=0.7), gens)
    assert torch.allclose(logp, torch.log_softmax(LOGITS, -1)[tok])
    greedy, glogp = _choose(LOGITS[None], SamplingParams(temperature=0.0), gens[:1])
    assert greedy.tolist() == [2] and torch.allclose(glogp, torch.log_softmax(LOGITS, -1)[2])


def test_a_rows_draw_does_not_depend_on_its_batch_mates() -> None:
    params = SamplingParams(temperature=1.0)
    alone = [
        _choose(LOGITS[None].clone(), params, [torch.Generator().manual_seed(s)])[0].item()
        for s in range(40)
    ]
    other = torch.randn(40, len(LOGITS)) * 5  # batch-mates with other logits and seeds
    batch = torch.stack([LOGITS, *other])
    for s in range(40):
        gens = [torch.Generator().manual_seed(s)] + [
            torch.Generator().manual_seed(1000 + i) for i in range(40)
        ]
        assert _choose(batch.clone(), params, gens)[0][0].item() == alone[s]
    # rows with their own temperature (the serving batch) draw as they would alone
    mixed = choose_rows(
        batch[:2].clone(),
        [params, SamplingParams(temperature=0.3)],
        [torch.Generator().manual_seed(7), torch.Generator().manual_seed(8)],
    )[0]
    assert mixed[0].item() == alone[7]
