"""The engine's own logic without a server: the request it sends (token ids in, log-probs
out, seeds), how it reads replies, how `auto` chooses, the per-step check and the
importance correction in the loss. The real vLLM server is tested in
tests/integration/test_vllm_engine.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from agentrft.engine import ENGINE_ENV, choose_engine, lora_rank_for_vllm
from agentrft.engine.vllm_client import completion_body, parse_completion
from agentrft.engine.vllm_server import ServerSpec, _command, _environment
from agentrft.errors import ConfigError, EngineMismatch, EngineUnavailable
from agentrft.job import EngineCheck
from agentrft.policy import SamplingParams
from agentrft.train.engine_check import check_engine
from agentrft.train.loss import LossConfig, policy_loss


def test_the_request_sends_token_ids_and_asks_for_ids_and_logprobs_back():
    params = SamplingParams(temperature=0.7, top_p=0.9, stop=("</tool_call>",), min_tokens=2)
    body = completion_body([5, 6, 7], 32, params, "step-3-abc", [2, 0], seed=None)
    assert body["prompt"] == [5, 6, 7] and body["model"] == "step-3-abc"
    assert body["logprobs"] == 0 and body["return_token_ids"] is True
    assert body["skip_special_tokens"] is False and body["include_stop_str_in_output"] is True
    assert body["stop_token_ids"] == [0, 2] and body["stop"] == ["</tool_call>"]
    assert body["min_tokens"] == 2 and body["max_tokens"] == 32
    assert "seed" not in body
    assert completion_body([1], 4, params, "base", [2], seed=11)["seed"] == 11


def test_a_grammar_constraint_is_refused_not_ignored():
    params = SamplingParams(constraint=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="constrained_tool_calls"):
        completion_body([1], 4, params, "base", [2], None)


def test_replies_become_completions_with_the_stop_kind():
    reply = {
        "model": "step-1-x",
        "choices": [
            {
                "token_ids": [10, 11, 2],
                "logprobs": {"token_logprobs": [-0.5, -1.0, -0.1]},
                "finish_reason": "stop",
                "stop_reason": None,
            }
        ],
    }
    c, used = parse_completion(reply, "u")
    assert used == "step-1-x" and c.tokens == (10, 11, 2) and c.ended_by_stop_token
    assert c.reply_tokens == (10, 11)
    reply["choices"][0].update(stop_reason="</tool_call>")
    c, _ = parse_completion(reply, "u")
    assert c.stop_text == "</tool_call>" and not c.ended_by_stop_token
    reply["choices"][0]["finish_reason"] = "length"
    assert parse_completion(reply, "u")[0].finish_reason == "length"


@pytest.mark.parametrize(
    "reply",
    [
        {},
        {"choices": []},
        {
            "choices": [{"text": "hi", "finish_reason": "stop"}]
        },  # no token_ids: not agentrft's request
        {"choices": [{"token_ids": [1, 2], "logprobs": {"token_logprobs": [-1.0]}}]},
    ],
)
def test_a_reply_without_ids_and_logprobs_is_an_engine_error(reply):
    with pytest.raises(EngineUnavailable):
        parse_completion(reply, "http://engine")


def test_auto_picks_local_on_cpu_and_the_flag_overrides_the_job(monkeypatch):
    monkeypatch.delenv(ENGINE_ENV, raising=False)
    assert choose_engine("auto", "cpu")[0] == "local"
    assert choose_engine("vllm", "cpu")[0] == "vllm"
    monkeypatch.setenv(ENGINE_ENV, "vllm")
    assert choose_engine("local", "cpu") == ("vllm", "--engine vllm")
    monkeypatch.setenv(ENGINE_ENV, "fast")
    with pytest.raises(ConfigError, match="auto, local or vllm"):
        choose_engine("auto", "cpu")


def test_lora_ranks_round_up_to_what_vllm_takes():
    assert [lora_rank_for_vllm(r) for r in (1, 8, 9, 16, 33)] == [8, 8, 16, 16, 64]
    with pytest.raises(ConfigError):
        lora_rank_for_vllm(4096)


def test_vllm_cpu_starts_on_both_cores_with_whole_prefills_and_runtime_lora(tmp_path: Path):
    python = tmp_path / "venv" / "bin" / "python"
    (tmp_path / "venv" / "lib").mkdir(parents=True)
    (tmp_path / "venv" / "lib" / "libiomp5.so").write_bytes(b"")
    spec = ServerSpec(tmp_path / "model", max_lora_rank=16)
    cmd = _command(spec, python, 8000)
    assert "--no-enable-chunked-prefill" in cmd  # the seeded-request crash, see vllm_client
    assert cmd[cmd.index("--max-lora-rank") + 1] == "16" and "--enable-lora" in cmd
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"
    env = _environment(spec, python)
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert env["LD_PRELOAD"].startswith(str(tmp_path / "venv" / "lib" / "libiomp5.so"))
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    (tmp_path / "venv" / "lib" / "libiomp5.so").unlink()  # a CUDA build: chunked prefill stays
    assert "--no-enable-chunked-prefill" not in _command(spec, python, 8000)


CHECK = EngineCheck(warn_gap=0.1, stop_gap=0.5)


def test_the_check_passes_warns_and_stops():
    assert check_engine({"engine/logprob_gap": 0.01}, CHECK, 1, "vllm", "base") is None
    assert "warn_gap" in (check_engine({"engine/logprob_gap": 0.2}, CHECK, 1, "vllm", "base") or "")
    with pytest.raises(EngineMismatch, match="stop_gap 0.5.*adapter sync"):
        check_engine({"engine/logprob_gap": 0.9, "engine/kl": 0.3}, CHECK, 4, "vllm", "step-3-x")
    with pytest.raises(EngineMismatch, match="2 replies came from another adapter"):
        check_engine(
            {"engine/logprob_gap": 0.0, "engine/wrong_adapter": 2.0}, CHECK, 2, "vllm", "s"
        )
    assert check_engine({}, CHECK, 1, "local", "base") is None  # nothing trained: no gap


def test_thresholds_must_be_ordered():
    with pytest.raises(ValueError, match="below warn_gap"):
        EngineCheck(warn_gap=0.5, stop_gap=0.1)


def test_truncated_importance_sampling_weights_tokens_by_the_capped_ratio():
    logp = torch.tensor([-1.0, -1.0, -1.0], requires_grad=True)
    engine = torch.tensor([-1.0, -1.5, -4.0])  # ratios 1, e^0.5 = 1.65, e^3 = 20 -> capped at 2
    adv = torch.ones(3)
    off = policy_loss(logp, logp.detach(), adv, 3.0, LossConfig(tis_cap=0.0), None, engine)
    on = policy_loss(logp, logp.detach(), adv, 3.0, LossConfig(tis_cap=2.0), None, engine)
    assert float(off.tis_weight_sum) == 3.0 and float(off.tis_capped) == 0
    assert math.isclose(float(on.tis_weight_sum), 1 + math.exp(0.5) + 2.0, rel_tol=1e-5)
    assert float(on.tis_capped) == 1
    (g_on,) = torch.autograd.grad(on.loss, logp)
    (g_off,) = torch.autograd.grad(off.loss, logp)
    assert torch.allclose(g_on, g_off * torch.tensor([1.0, math.exp(0.5), 2.0]))
