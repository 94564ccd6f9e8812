"""The HTML report from on-disk shapes: sections, inlined PNGs, escaping, missing data."""

from __future__ import annotations

import base64
import io
import json
import re
from pathlib import Path

from PIL import Image

from agentrft.evaluate.eval import eval_results, graded_records
from agentrft.evaluate.report import best_of_k_from, build_report, tool_call_counts, write_report
from tests.report_data import NASTY, eval_records, graded_groups, metrics_rows, summary_only

IMG = re.compile(r'<img alt="([^"]+)" src="data:image/png;base64,([A-Za-z0-9+/=]+)">')
SECTIONS = (
    "doctor",
    "reward-curve",
    "hack-watch",
    "pipeline",
    "tool-calls",
    "best-of-k",
    "trajectories",
)


def test_full_report(tmp_path: Path) -> None:
    before, after = (
        eval_records(1, calls_mean=3, reward_p=0.2),
        eval_records(2, calls_mean=1, reward_p=0.7),
    )
    path = write_report(
        tmp_path / "out" / "report.html",
        metrics=metrics_rows(),
        before=before,
        after=after,
        rollouts=after,
        title="demo <run>",
    )
    page = path.read_text(encoding="utf-8")
    for sid in SECTIONS:
        assert f'<section id="{sid}">' in page
    images = IMG.findall(page)
    assert [alt for alt, _ in images] == [
        "reward curve",
        "tool calls per rollout",
        "best-of-k curve",
    ]
    for _, data in images:
        png = Image.open(io.BytesIO(base64.b64decode(data)))
        assert png.format == "PNG" and png.width > 600 and png.height > 250
        assert len(png.convert("RGB").getcolors(1 << 16) or []) > 20  # drawn, not blank
    assert page.count('class="traj"') == 4
    assert (
        NASTY not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    )  # escaped
    assert "demo &lt;run&gt;" in page
    assert not re.search(r"<script|<link|src=\"http|url\(", page)  # self-contained, no scripts
    assert (
        "→ search({&quot;q&quot;: &quot;q0&quot;})" in page
    )  # tool calls shown with their arguments
    assert "<summary>prompt: 3 earlier messages" in page  # system + few-shot folded away


def test_best_and_worst_trajectories_first() -> None:
    records = eval_records(5, calls_mean=1, reward_p=0.5)
    page = build_report(rollouts=records, max_trajectories=2)
    shown = re.findall(r"reward (\d\.\d{3})", page)
    assert shown == ["1.000", "0.000"]


def test_missing_inputs_are_said_not_hidden() -> None:
    page = build_report()
    for sid in SECTIONS:
        assert f'<section id="{sid}">' in page
    assert "data:image/png" not in page
    assert page.count('class="missing"') == 7


def test_summary_only_results_and_counts() -> None:
    records = eval_records(1, calls_mean=2, reward_p=0.5)
    counts = tool_call_counts(records)
    assert sum(counts.values()) == len(records) and set(counts) <= set(range(0, 5))
    summary = summary_only(records)
    assert sum(tool_call_counts(summary).values()) == 5
    assert best_of_k_from(summary) == {1: 0.3, 2: 0.45, 4: 0.6}
    curve = best_of_k_from(records)
    assert list(curve) == [1, 2, 3, 4] and curve[1] <= curve[4]
    page = build_report(before=summary, after={"rollouts": records})
    assert len(IMG.findall(page)) == 2  # tool calls, best of k; no metrics given
    assert "<th>before</th><th>after</th>" in page


def test_reads_what_agentrft_eval_writes() -> None:
    """`eval_results` (JSON, as written to disk) for the overview and histograms;
    `graded_records` for best-of-k and the conversations."""
    before, after = (
        graded_groups(1, calls_mean=3, reward_p=0.3),
        graded_groups(2, calls_mean=1, reward_p=0.8),
    )
    results = [json.loads(json.dumps(eval_results(g))) for g in (before, after)]
    page = build_report(before=results[0], after=results[1])
    assert [alt for alt, _ in IMG.findall(page)] == ["tool calls per rollout"]
    assert tool_call_counts(results[1]) == {
        int(k): v for k, v in eval_results(after)["tool_calls_histogram"].items()
    }
    mean_after = eval_results(after)["reward"]["mean"]
    assert f"<td>{mean_after:.3f}</td>" in page
    records = graded_records(after)
    page = build_report(before=graded_records(before), after=records, rollouts=records)
    assert [alt for alt, _ in IMG.findall(page)] == ["tool calls per rollout", "best-of-k curve"]
    assert page.count('class="traj"') == 4


def test_the_doctor_and_the_hack_watch_have_their_sections(tmp_path: Path) -> None:
    from agentrft.evaluate.report import write_report

    run = tmp_path / "run"
    (run / "readings").mkdir(parents=True)
    (run / "readings" / "step-3.html").write_text("<html></html>")
    flag = {"step": 3, "kind": "shaping", "metric": "sub_rewards/near", "message": "near rose"}
    (run / "hack_watch.jsonl").write_text(json.dumps(flag) + "\n")
    doctor = {
        "job": "job.yaml",
        "rows": 6,
        "k": 4,
        "wall_s": 12.0,
        "checks": [
            {
                "rule": "reward is not hackable",
                "status": "fail",
                "evidence": ["probe x"],
                "fix": ["cap it"],
            }
        ],
    }
    metrics = [
        {"step": s, "reward/mean": 0.1 * s, "hack_watch/flags": float(s == 3)} for s in (1, 2, 3)
    ]
    page = write_report(
        tmp_path / "report.html", metrics=metrics, doctor=doctor, run_dir=run
    ).read_text()
    assert "FAIL" in page and "cap it" in page
    assert "1 flag(s)" in page and "shaping: near rose" in page
    assert 'href="run/readings/step-3.html"' in page


def test_the_steps_table_shows_async_staleness_and_the_trainers_wait() -> None:
    from agentrft.evaluate.report import pipeline_html

    synchronous = [{"step": 1, "time/step_s": 10.0, "time/trainer_idle_s": 6.0}]
    html = pipeline_html(synchronous)
    assert "<td>60%</td>" in html and "staleness" not in html
    piped = [
        {
            "step": 2,
            "time/step_s": 5.0,
            "time/trainer_idle_share": 0.2,
            "async/staleness": 1.0,
            "async/off_policy_rollouts": 16.0,
            "async/dropped_stale": 0.0,
            "async/finished_on_old_version": 3.0,
        }
    ]
    html = pipeline_html(piped)
    assert "staleness" in html and "finished on the old version" in html
    assert "<td>20%</td><td>1</td><td>16</td><td>0</td><td>3</td>" in html
    assert "No training step" in pipeline_html([])
    assert 'id="pipeline"' in build_report(metrics=piped)
