"""The kernels recipe's honest path: genuine kernels pass the gates and score above 0, a faster
one scores more; the reward as a function of timings; the task list validated at load with
errors naming file and line; the shipped data is what `agentrft data kernels` builds."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from agentrft.cli import main
from agentrft.errors import ConfigError
from agentrft.tasks.kernels.dataset import DEFAULT_TASKS, build_dataset, load_tasks
from tests.needs import needs_bwrap

from .conftest import RECIPE, answer

# genuine kernels, one per task they solve: each must pass the static gate
GENUINE = {
    "softmax_rows": "import torch\n\ndef kernel(x):\n    return torch.softmax(x, dim=-1)",
    "log_softmax_rows": "import torch.nn.functional as F\n\ndef kernel(x):\n    return F.log_softmax(x, dim=-1)",
    "layernorm": "import torch.nn.functional as F\n\ndef kernel(x, w, b):\n    return F.layer_norm(x, x.shape[-1:], w, b, 1e-5)",
    "rmsnorm": "import torch\n\ndef kernel(x, w):\n    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w",
    "gelu_tanh": "from torch.nn import functional as F\n\ndef kernel(x):\n    return F.gelu(x, approximate='tanh')",
    "silu": "import torch\n\ndef kernel(x):\n    return x * torch.sigmoid(x)",
    "bias_relu": "import torch\n\ndef kernel(x, b):\n    return torch.relu(x + b)",
    "cumsum_rows": "import torch\n\ndef kernel(x):\n    return torch.cumsum(x, dim=1)",
    "cummax_rows": "import torch\n\ndef kernel(x):\n    return torch.cummax(x, dim=1).values",
    "one_hot": "import torch\n\ndef kernel(labels, c):\n    out = torch.zeros(labels.shape[0], c)\n    out[torch.arange(labels.shape[0]), labels] = 1.0\n    return out",
    "conv1d_taps": "import torch.nn.functional as F\n\ndef kernel(x, w):\n    return F.conv1d(x[:, None], w[None, None])[:, 0]",
    "polynomial": "def kernel(x):\n    return 1.0 + x * (2.0 + x * (3.0 + x * (4.0 + 5.0 * x)))",
    "sum_of_squares_cols": "import numpy as np\nimport torch\n\ndef kernel(x):\n    a = x.numpy()\n    return torch.from_numpy(np.einsum('ij,ij->j', a, a))",
}
SLOW_CUMSUM = (  # right, and far slower than the reference's loop: one element at a time
    "import torch\n\ndef kernel(x):\n    out = torch.zeros_like(x)\n"
    "    for i in range(x.shape[0]):\n        total = 0.0\n        for j in range(x.shape[1]):\n"
    "            total = total + float(x[i, j])\n            out[i, j] = total\n    return out"
)


@pytest.mark.parametrize("task", sorted(GENUINE))
def test_genuine_kernels_pass_the_static_gate(
    task: str, static_checks: Any, grading: Any, items: dict[str, Any]
) -> None:
    code = grading.extract_code(answer(GENUINE[task])["output_text"])
    assert static_checks.problems(code, items[task]) == []


@needs_bwrap
def test_a_genuine_kernel_scores_above_zero_and_a_faster_one_more(
    job_grader: Any, items: dict[str, Any]
) -> None:
    item = items["cumsum_rows"]  # the reference loops over 256 columns
    fast = job_grader.grade(answer(GENUINE["cumsum_rows"]), item)
    slow = job_grader.grade(answer(SLOW_CUMSUM), item)
    assert fast.error is None and slow.error is None
    assert fast.sub_scores["static"] == slow.sub_scores["static"] == 1.0
    assert fast.sub_scores["checked.correct"] == slow.sub_scores["checked.correct"] == 1.0
    assert slow.score == pytest.approx(0.2)  # correct, far slower: the floor
    assert fast.score > 0.6 > slow.score  # torch.cumsum is well over 4x the loop


def test_reward_grows_with_log_speedup(grading: Any) -> None:
    s = grading.speed_score
    assert s(1.0, 10.0) == s(1.0, 1.0) == s(1.0, 1.05) == pytest.approx(0.2)  # slower or noise
    assert s(1.0, 1 / 8) == s(1.0, 1 / 100) == pytest.approx(1.0)
    values = [s(1.0, 1 / k) for k in (1.2, 1.5, 2, 3, 4, 6)]
    assert values == sorted(values) and len(set(values)) == len(values)
    # equal steps in log-speedup give equal steps in reward
    assert s(1.0, 1 / 2) - s(1.0, 1 / 1.5) == pytest.approx(s(1.0, 1 / 4) - s(1.0, 1 / 3), rel=1e-9)
    assert math.isclose(s(1.0, 0.0), 0.2)  # a zero time is no speedup


def test_the_answers_code_block_is_the_submission(grading: Any) -> None:
    text = "First try:\n```python\ndef helper():\n    pass\n```\nFinal:\n```python\ndef kernel(x):\n    return x\n```"
    assert grading.extract_code(text) == "def kernel(x):\n    return x\n"
    assert (
        grading.extract_code("```python\ndef kernel(x):\n    return x * 2") is not None
    )  # cut off
    assert grading.extract_code("no code here") is None


@pytest.mark.parametrize(
    ("folder", "flags"), [("data", []), ("data-easy", ["--prefill-signature"])]
)
def test_the_shipped_data_is_what_the_builder_makes(
    tmp_path: Path, folder: str, flags: list[str]
) -> None:
    assert main(["data", "kernels", "--out", str(tmp_path), *flags]) == 0
    for split in ("train", "val"):
        assert (tmp_path / f"{split}.jsonl").read_text() == (
            RECIPE / folder / f"{split}.jsonl"
        ).read_text()


def test_the_easy_variants_prefill_plus_one_expression_is_a_submission(
    static_checks: Any, grading: Any, tmp_path: Path
) -> None:
    build_dataset(DEFAULT_TASKS, tmp_path, prefill=True)
    row = json.loads((tmp_path / "train.jsonl").read_text().splitlines()[0])
    assert row["task"] == "softmax_rows"
    item = {k: v for k, v in row.items() if k not in ("messages", "prefill")}
    good = row["prefill"] + "torch.softmax(x, dim=-1)\n```\nThis uses the fused op."
    assert static_checks.problems(grading.extract_code(good), item) == []
    for hack in ("reference(x)\n```", "x\n```", "x.clone()\n```"):  # the gates still hold
        assert static_checks.problems(grading.extract_code(row["prefill"] + hack), item)


def test_task_list_is_big_enough_and_split(tmp_path: Path) -> None:
    tasks = load_tasks(DEFAULT_TASKS, run=False)
    assert 20 <= len(tasks) <= 40
    val = [t for t in tasks if t.split == "val"]
    assert 4 <= len(val) < len(tasks) // 2
    report = build_dataset(DEFAULT_TASKS, tmp_path)
    assert (report.train, report.val) == (len(tasks) - len(val), len(val))


TASK = """tasks:
- name: fine
  reference: |
    def reference(x):
        return x * 2
  args: {x: {shape: [N], dtype: float32}}
  cases: [{N: 3}]
  timing: {N: 10}
- name: broken
  reference: |
    def reference(x):
        return x @ torch.ones(3)
  args: {x: {shape: [N, D], dtype: float32}}
  cases: [{N: 2, D: 3}, {N: 4, D: 5}]
  timing: {N: 4, D: 3}
"""


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            TASK,
            r"tasks\.yaml:9 \(task 'broken'\): cases\[1\] \{'N': 4, 'D': 5\}: the reference raises RuntimeError",
        ),
        (
            TASK.replace("cases: [{N: 3}]", "cases: [{M: 3}]"),
            r":2 \(task 'fine'\): cases\[0\].*needs size 'N'",
        ),
        (
            TASK.replace("args: {x: {shape: [N], dtype: float32}}", "args: {y: {shape: [N]}}"),
            r":2 \(task 'fine'\): `args` names \['y'\] but reference takes \['x'\]",
        ),
        (
            TASK.replace("return x * 2", "return x *"),
            r":2 \(task 'fine'\): the reference is not valid Python",
        ),
        (TASK.replace("return x * 2", "return [x]"), r"must return one torch.Tensor, got list"),
        (
            TASK.replace(
                "dtype: float32}}\n  cases: [{N: 3}]", "dtype: float8}}\n  cases: [{N: 3}]"
            ),
            r"dtype 'float8'",
        ),
        (
            TASK.replace("name: broken", "name: fine"),
            r":9: task name 'fine' is already used at .*:2",
        ),
        (TASK.replace("return x * 2", "return x * torch.rand(1)"), r"not deterministic"),
    ],
)
def test_a_task_that_cannot_run_is_refused_naming_file_and_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "tasks.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_tasks(path)
