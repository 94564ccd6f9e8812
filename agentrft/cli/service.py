"""`agentrft serve`: start the service (see agentrft/service/__init__.py).

AGENTRFT_API_KEYS=sk-mine agentrft serve --data-dir service-data --port 8000
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from agentrft.errors import ConfigError

KEYS_ENV = "AGENTRFT_API_KEYS"


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from agentrft.serve.app import DRAIN_S
    from agentrft.service.app import create_app
    from agentrft.service.state import read_keys

    try:
        keys = read_keys(args.api_keys_file, os.environ.get(KEYS_ENV))
    except OSError as exc:
        raise ConfigError(f"{args.api_keys_file}: cannot read the API keys file: {exc}") from None
    app = create_app(
        args.data_dir,
        api_keys=keys,
        workers=args.workers,
        executor=args.executor,
        ray_address=args.ray_address,
    )
    auth = (
        f"{len(keys)} API key(s)"
        if keys
        else f"NO API keys (anyone who can reach it may use it; set {KEYS_ENV} or --api-keys-file)"
    )
    print(
        f"agentrft service on http://{args.host}:{args.port}/v1 (dashboard http://{args.host}:{args.port}/), data in {args.data_dir}, "
        f"{args.workers} worker(s) ({args.executor}), {auth}",
        flush=True,
    )
    # on SIGTERM, in-flight chat requests get serve-model's drain time, then are cancelled
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        timeout_graceful_shutdown=round(DRAIN_S),
    )
    return 0


def add_commands(subparsers: Any) -> None:
    """Register `agentrft serve` on the main parser's subparsers."""
    s = subparsers.add_parser(
        "serve",
        help="serve OpenAI's fine-tuning API (files, RFT jobs, graders, models) and a dashboard",
    )
    s.add_argument(
        "--data-dir",
        default="service-data",
        help="SQLite state, uploaded files and job runs (default ./service-data)",
    )
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument(
        "--workers", type=int, default=1, help="jobs trained at the same time (default 1)"
    )
    s.add_argument(
        "--api-keys-file",
        default=None,
        help=f"API keys, one per line (also from ${KEYS_ENV}, comma-separated)",
    )
    s.add_argument(
        "--executor",
        choices=["local", "ray"],
        default="local",
        help="where jobs run: local worker processes (default) or Ray tasks",
    )
    s.add_argument(
        "--ray-address",
        default=None,
        help="Ray cluster to submit to (default with --executor ray: a local Ray started by the server)",
    )
    s.set_defaults(func=cmd_serve)
