"""A run directory's account of itself: `job.json` (the job, its secrets always redacted)
and `run.json` (where the job came from: its source and the folder its relative paths
start from).

Both `agentrft train` and the service write them here and nowhere else, so a run
directory never holds a header value, a URL password or a query value
(`agentrft.redact.redact_job`), whoever started it. A resume gets the secrets back from the
job file (`agentrft train --resume`) or from the service's secret store, through
`restore_secrets`, which checks that they belong to this job.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agentrft.job import Job, job_from_dict
from agentrft.redact import redact_job, restore_secrets


def _write_private(path: Path, text: str) -> None:
    """`text` to `path`, mode 0600 whatever the umask, replacing any older file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)


def write_run_files(run_dir: Path, job: Job, job_source: str, base_dir: Path) -> None:
    """job.json (redacted) and run.json of a new run in `run_dir`."""
    _write_private(
        run_dir / "job.json", json.dumps(redact_job(job.model_dump(mode="json")), indent=2)
    )
    _write_private(
        run_dir / "run.json",
        json.dumps(
            {"job_source": job_source, "base_dir": str(base_dir.resolve()), "model": job.model}
        ),
    )


def read_run_files(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the stored, redacted job JSON, run.json) of `run_dir`."""
    meta = json.loads((run_dir / "run.json").read_text())
    stored = json.loads((run_dir / "job.json").read_text())
    return stored, meta


def run_job(run_dir: Path, full: dict[str, Any] | None) -> Job:
    """The job of `run_dir`, with its secrets from `full` (the job as it was given, e.g. from
    the service's secret store) when they match. ValueError with the fix when the stored job
    had secrets and `full` does not match it."""
    stored, meta = read_run_files(run_dir)
    data = restore_secrets(stored, full, str(run_dir / "job.json"))
    return job_from_dict(data, source=meta["job_source"], base_dir=Path(meta["base_dir"]))
