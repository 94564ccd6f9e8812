"""The report as a browser shows it: headless Chromium renders the page from disk, and the
screenshot and the rendered DOM are checked. Skipped only when Chromium is not installed
(`make test` installs it), and never under CI (tests/needs.py)."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from agentrft.evaluate.report import write_report
from tests.needs import CHROMIUM, skip_without
from tests.report_data import eval_records, metrics_rows

pytestmark = pytest.mark.browser

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    skip_without("chromium")
    assert CHROMIUM is not None
    profile = tmp_path / "profile"
    return subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_report_renders_in_chromium(tmp_path: Path) -> None:
    before, after = (
        eval_records(1, calls_mean=3, reward_p=0.2),
        eval_records(2, calls_mean=1, reward_p=0.7),
    )
    page = write_report(
        tmp_path / "report.html",
        metrics=metrics_rows(),
        before=before,
        after=after,
        rollouts=after,
        title="agentrft report",
    )
    assert page.read_text().count('<img alt="') == 3

    dom = chromium(tmp_path, "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    for sid in ("reward-curve", "tool-calls", "best-of-k", "trajectories"):
        assert f'<section id="{sid}">' in dom.stdout, sid
    assert dom.stdout.count('src="data:image/png;base64,') == 3
    assert dom.stdout.count('class="traj"') == 4

    shot = tmp_path / "shot.png"
    run = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,2400", page.as_uri())
    assert run.returncode == 0 and shot.is_file(), run.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 2400)
    colors = Counter(image.getdata())
    background, share = colors.most_common(1)[0]
    assert share / (1200 * 2400) < 0.9, "the page is (almost) blank"
    # the plots were decoded and drawn: their line and bar colours are on screen
    near = lambda rgb, target: sum(abs(a - b) for a, b in zip(rgb, target, strict=True)) < 40  # noqa: E731
    assert (
        sum(n for rgb, n in colors.items() if near(rgb, (22, 163, 74))) > 500
    )  # "after" bars (#16a34a)
    assert (
        sum(n for rgb, n in colors.items() if near(rgb, (31, 119, 180))) > 200
    )  # matplotlib's first line colour
