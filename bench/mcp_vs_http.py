"""The quickstart's lookup tool trained over HTTP (`job.yaml`) and over MCP (`job_mcp.yaml`),
one short step each, with the metrics side by side.

    .venv/bin/python bench/mcp_vs_http.py [--out DIR]

Both jobs are cut the same way as tests/integration/test_mcp_train.py (one step of 2 rows x 2
rollouts, fp32, the job's seed). Rewards, call counts, turns and tool errors should agree; the
timings and the sampler's batching differ because the MCP calls go through one session per
rollout, so the rollouts reach the sampler at different moments.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHOWN = (
    "reward/mean",
    "reward/std",
    "rollouts/discarded",
    "rollouts/tool_calls/mean",
    "rollouts/tool_errors",
    "rollouts/turns/mean",
    "rollouts/stop_reasons/final_answer",
    "rollouts/sampled_tokens/mean",
    "rollouts/tool_latency_s/mean",
    "rollouts/latency_s/mean",
    "sampler/batches",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="where the two runs go")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="mcp_vs_http-"))
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from test_mcp_train import short

    from agentrft.train.loop import train

    metrics = {}
    for name in ("job.yaml", "job_mcp.yaml"):
        train(short(name), out / name)
        first = (out / name / "metrics.jsonl").read_text().splitlines()[0]
        metrics[name] = json.loads(first)
    print(f"{'metric':40} {'HTTP':>12} {'MCP':>12}")
    for key in SHOWN:
        http, mcp = (metrics[n].get(key, float("nan")) for n in ("job.yaml", "job_mcp.yaml"))
        print(f"{key:40} {http:12.3f} {mcp:12.3f}")
    print(f"runs in {out}")


if __name__ == "__main__":
    main()
