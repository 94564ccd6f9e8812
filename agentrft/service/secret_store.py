"""The service's secret store: each job's full request (header values, URL credentials)
encrypted at rest, apart from the database.

`service.db`, its WAL and the run directories hold jobs with their secrets masked or
redacted (`agentrft.redact`); the one copy in full is `DATA/secrets/JOB_ID.fernet`, a
Fernet token (AES-128-CBC with an HMAC-SHA256, from `cryptography`). The executor decrypts
it when it starts the job's worker and hands the job to the worker on its stdin, so the
secrets exist in the clear only in memory. The file is deleted when the job ends (succeeded,
failed or cancelled; a paused job keeps it to resume), and at the next start for a job that
ended while the server was being killed.

The key comes from `AGENTRFT_SECRET_KEY` (a Fernet key: `agentrft serve` prints how to make
one) or from the key file `AGENTRFT_SECRET_KEY_FILE` (default `DATA/secret.key`), which the
first start creates with mode 0600. Keep the key out of the data directory (the variable, or
a key file elsewhere) when copies of that directory leave the machine. A missing or wrong
key is an error at start-up that says which key the jobs need, never a silent new key.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agentrft.errors import ConfigError

KEY_ENV = "AGENTRFT_SECRET_KEY"
KEY_FILE_ENV = "AGENTRFT_SECRET_KEY_FILE"
MAKE_KEY = (
    'python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"'
)


class SecretStore:
    """Encrypted job requests under `root` (one file per job), with the key `key`."""

    def __init__(self, root: Path, key: bytes, key_source: str) -> None:
        from cryptography.fernet import Fernet

        try:
            self._fernet = Fernet(key)
        except ValueError:
            raise ConfigError(
                f"{key_source}: not a Fernet key (32 url-safe base64 bytes); make one with {MAKE_KEY}"
            ) from None
        self.root = root
        self.key_source = key_source
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        root.chmod(0o700)
        self._check_key()

    @classmethod
    def open(cls, data_dir: Path) -> SecretStore:
        """The store of `data_dir`, keyed from the environment or the key file (made on the
        first start, when no secret is stored yet)."""
        root = data_dir / "secrets"
        env_key = os.environ.get(KEY_ENV)
        if env_key:
            return cls(root, env_key.strip().encode(), f"${KEY_ENV}")
        key_file = Path(os.environ.get(KEY_FILE_ENV) or data_dir / "secret.key")
        if not key_file.is_file():
            if root.is_dir() and any(root.glob("*.fernet")):
                raise ConfigError(
                    f"{key_file}: the secret key is missing, and {root} holds secrets encrypted with it; "
                    f"restore the key file, or set {KEY_ENV} to the key the jobs were created with"
                )
            from cryptography.fernet import Fernet

            key_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(Fernet.generate_key() + b"\n")
        try:
            key = key_file.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"{key_file}: cannot read the secret key: {exc}") from None
        return cls(root, key, str(key_file))

    def _path(self, job_id: str) -> Path:
        if not job_id.replace("-", "").isalnum():
            raise ValueError(f"not a job id: {job_id!r}")
        return self.root / f"{job_id}.fernet"

    def _check_key(self) -> None:
        """Fail at start-up, not at a job's start, when the key is not the store's."""
        existing = next(iter(sorted(self.root.glob("*.fernet"))), None)
        if existing is not None:
            self.get(existing.stem)

    def put(self, job_id: str, job: dict[str, Any]) -> None:
        """Store `job` (with its secrets) encrypted, mode 0600, replacing any older copy."""
        path = self._path(job_id)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(self._fernet.encrypt(json.dumps(job).encode()))
        tmp.rename(path)

    def get(self, job_id: str) -> dict[str, Any] | None:
        """The stored job, decrypted; None when none was stored (a job without secrets)."""
        from cryptography.fernet import InvalidToken

        path = self._path(job_id)
        if not path.is_file():
            return None
        try:
            data: dict[str, Any] = json.loads(self._fernet.decrypt(path.read_bytes()))
        except InvalidToken:
            raise ConfigError(
                f"{path}: cannot be decrypted with the secret key from {self.key_source}; "
                f"start the server with the key its jobs were created with ({KEY_ENV} or {KEY_FILE_ENV})"
            ) from None
        return data

    def delete(self, job_id: str) -> None:
        """Forget a job's secrets (the executor does it when the job ends)."""
        self._path(job_id).unlink(missing_ok=True)

    def job_ids(self) -> list[str]:
        """The jobs whose secrets are stored."""
        return sorted(p.stem for p in self.root.glob("*.fernet"))
