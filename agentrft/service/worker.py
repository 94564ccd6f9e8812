"""One job's worker process: `python -m agentrft.service.worker RUN_DIR`.

The server writes `RUN_DIR/job.json` (the job, secrets redacted) and `RUN_DIR/run.json`
the way `agentrft train` does, then starts this module and writes the job with its secrets
to its stdin (from the encrypted secret store; they never touch the disk in the clear). It trains with
the same `train` as the CLI; a run directory that already holds a checkpoint is resumed
exactly (`train --resume`), so a job interrupted by a server restart or a pause continues
where its last checkpoint left it.

The outcome goes to `RUN_DIR/result.json` (`{"status": "succeeded"}` or `{"error":
{"code", "message"}}`); the server reads it when the process exits. The worker dies with
the server (Linux: PR_SET_PDEATHSIG), so a killed server never leaves a job training
unseen; after the restart the job is started again and resumes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from agentrft.lifetime import die_with_parent


def die_with_parent_server(parent_pid: int | None) -> None:
    """SIGKILL this worker when the server exits (Linux only); exit now if it already has."""
    die_with_parent(signal.SIGKILL)
    if parent_pid is not None and os.getppid() != parent_pid:  # the server died before prctl
        os._exit(1)


def error_code(exc: BaseException) -> str:
    """OpenAI's error codes are snake_case: TrainingAborted -> training_aborted."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(exc).__name__).lower()


def write_result(run_dir: Path, result: dict[str, Any]) -> None:
    tmp = run_dir / "result.json.tmp"
    tmp.write_text(json.dumps(result))
    tmp.rename(run_dir / "result.json")


def fresh_start(run_dir: Path) -> None:
    """A job with no checkpoint starts over: drop what an interrupted first attempt wrote."""
    for name in ("metrics.jsonl", "result.json"):
        (run_dir / name).unlink(missing_ok=True)
    for name in ("rollouts", "tensorboard", "final", "checkpoints"):
        shutil.rmtree(run_dir / name, ignore_errors=True)


def job_on_stdin() -> dict[str, Any] | None:
    """The job with its secrets, as the executor writes it to this process's stdin."""
    text = sys.stdin.read() if sys.stdin is not None and not sys.stdin.isatty() else ""
    return json.loads(text) if text.strip() else None


def load_run_job(run_dir: Path) -> Any:
    """The worker's Job: run_dir's job.json with the secrets from stdin put back."""
    from agentrft.errors import ConfigError
    from agentrft.train.run_files import run_job

    try:
        return run_job(run_dir, job_on_stdin())
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def run(run_dir: Path) -> int:
    from agentrft.errors import AgentRFTError
    from agentrft.train.checkpoint import latest_checkpoint
    from agentrft.train.loop import train

    try:
        job = load_run_job(run_dir)
    except AgentRFTError as exc:
        write_result(run_dir, {"error": {"code": error_code(exc), "message": str(exc)}})
        return 1
    resume = latest_checkpoint(run_dir) is not None
    if not resume:
        fresh_start(run_dir)
    try:
        train(job, run_dir, resume=resume)
    except AgentRFTError as exc:
        write_result(run_dir, {"error": {"code": error_code(exc), "message": str(exc)}})
        return 1
    except Exception as exc:  # recorded for the job's `error`, and the traceback for its log
        traceback.print_exc()
        write_result(
            run_dir,
            {
                "error": {
                    "code": "server_error",
                    "message": f"training crashed: {type(exc).__name__}: {exc}",
                }
            },
        )
        return 1
    write_result(run_dir, {"status": "succeeded"})
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    parent = os.environ.get("AGENTRFT_SERVICE_PID")
    die_with_parent_server(int(parent) if parent else None)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    return run(Path(args[0]))


if __name__ == "__main__":
    sys.exit(main())
