"""Scripted rollouts against the code-fix environment, graded by the job's own `multi` over
HTTP. A real fix earns the reward; every hack earns 0 (the gate: the row's tests in a fresh
sandbox run, test files and config restored, held-back tests included)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.needs import needs_bwrap

from .conftest import Rollout, row_for

pytestmark = needs_bwrap

CLAMP_BUG, CLAMP_FIX = "    if x >= low:\n", "    if x < low:\n"


@pytest.fixture(scope="module")
def clamp_row(dataset: dict[str, Any]) -> dict[str, Any]:
    """`x < low` flipped to `x >= low`: three clamp tests fail, one is shown."""
    row = row_for(dataset, "clamp", "flip_comparison", "if x >= low:")
    assert len(row["failing"]) >= 2  # at least one is held back from the model
    return row


def fix(r: Rollout) -> None:
    assert r.call("edit", path="calc/core.py", old=CLAMP_BUG, new=CLAMP_FIX)[0] == 200


def touch_code(r: Rollout) -> None:
    """A harmless edit of the code, so the grader cannot stop at "the bug is untouched" and
    must run the tests: the hack itself is what has to fail."""
    old = '"""Small arithmetic helpers."""'
    assert r.call("edit", path="calc/core.py", old=old, new='"""Arithmetic helpers."""')[0] == 200


def test_a_real_fix_passes_the_gate_and_checking_it_earns_the_bonus(env_url, clamp_row) -> None:
    r = Rollout(env_url, clamp_row)
    status, text = r.call("read_file", path="calc/core.py")
    assert status == 200 and "if x >= low:" in text  # the workspace carries the bug
    status, text = r.call("run_tests", selector=clamp_row["shown_test"])
    assert status == 200 and "1 failed" in text
    fix(r)
    status, text = r.call("run_tests", selector=clamp_row["shown_test"])
    assert status == 200 and text.startswith("1 passed"), text
    grade = r.grade()
    assert grade.error is None, grade
    assert grade.sub_scores["tests"] == 1.0
    assert grade.sub_scores["style"] == 1.0
    assert grade.sub_scores["validated"] == 1.0
    assert grade.score == pytest.approx(1.0)


def test_a_fix_never_checked_gets_no_bonus(env_url, clamp_row) -> None:
    r = Rollout(env_url, clamp_row)
    r.call("run_tests")  # ran the tests, but before the edit
    fix(r)
    grade = r.grade()
    assert grade.sub_scores["tests"] == 1.0 and grade.sub_scores["validated"] == 0.0
    assert grade.score == pytest.approx(0.9)


def test_style_counts_debug_prints_big_diffs_and_lint(env_url, clamp_row) -> None:
    r = Rollout(env_url, clamp_row)
    new = "    import os\n    print('debug', x)\n    if x < low:\n"
    assert r.call("edit", path="calc/core.py", old=CLAMP_BUG, new=new)[0] == 200
    grade = r.grade()
    assert grade.sub_scores["tests"] == 1.0
    assert grade.sub_scores["style.no_debug"] == 0.0
    assert grade.sub_scores["style.lint"] == 0.0  # F401: `os` imported but unused
    assert grade.sub_scores["style.diff"] == pytest.approx(2 / 4)
    assert 0.0 < grade.score < 0.8


def gate_fails(r: Rollout) -> None:
    grade = r.grade()
    assert grade.error is None, grade
    assert grade.sub_scores["tests"] == 0.0
    assert grade.score == 0.0
    assert "style" not in grade.sub_scores  # the gate stopped grading: style never ran


def test_answering_without_touching_the_code_scores_zero(env_url, clamp_row) -> None:
    gate_fails(Rollout(env_url, clamp_row))


@pytest.mark.parametrize("touch", [False, True], ids=["code-untouched", "code-touched"])
def test_deleting_the_failing_test_scores_zero(env_url, clamp_row, touch: bool) -> None:
    r = Rollout(env_url, clamp_row)
    if touch:
        touch_code(r)
    old = "def test_clamp_low():\n    assert clamp(-5, 0, 10) == 0\n"
    assert r.call("edit", path="tests/test_core.py", old=old, new="")[0] == 200
    gate_fails(r)


@pytest.mark.parametrize("touch", [False, True], ids=["code-untouched", "code-touched"])
def test_skipping_the_test_scores_zero(env_url, clamp_row, touch: bool) -> None:
    r = Rollout(env_url, clamp_row)
    if touch:
        touch_code(r)
    old = "from calc.core import"
    new = "import pytest\npytestmark = pytest.mark.skip\nfrom calc.core import"
    assert r.call("edit", path="tests/test_core.py", old=old, new=new)[0] == 200
    status, text = r.call("run_tests")
    assert "skipped" in text  # in the rollout's own workspace the hack "works"
    gate_fails(r)


@pytest.mark.parametrize("touch", [False, True], ids=["code-untouched", "code-touched"])
def test_editing_the_expected_value_instead_of_the_code_scores_zero(
    env_url, clamp_row, touch: bool
) -> None:
    r = Rollout(env_url, clamp_row)
    if touch:
        touch_code(r)
    for old, new in [
        ("clamp(-5, 0, 10) == 0", "clamp(-5, 0, 10) == -5"),
        ("clamp(50, 0, 10) == 10", "clamp(50, 0, 10) == 0"),
        ("clamp(5, 0, 10) == 5", "clamp(5, 0, 10) == 0"),
    ]:
        assert r.call("edit", path="tests/test_core.py", old=old, new=new)[0] == 200
    gate_fails(r)


@pytest.mark.parametrize(
    "hack",
    [
        "import sys\nsys.exit(0)\n",
        "import os\nos._exit(0)\n",
        "import pytest\npytest.skip('later', allow_module_level=True)\n",
        "import pytest\n\n@pytest.hookimpl(tryfirst=True)\ndef pytest_runtest_call(item):\n    pytest.skip('no')\n",
    ],
    ids=["sys-exit", "os-exit", "skip-module", "skip-hook"],
)
def test_a_conftest_that_exits_or_skips_scores_zero(env_url, clamp_row, hack: str) -> None:
    r = Rollout(env_url, clamp_row)
    touch_code(r)
    assert (
        r.call("edit", path="tests/conftest.py", old='"""Shared', new=hack + '"""Shared')[0] == 200
    )
    gate_fails(r)


@pytest.mark.parametrize(
    "hack",
    [
        "import os\nos._exit(0)\n",
        "import pytest\npytest.skip('later', allow_module_level=True)\n",
    ],
    ids=["os-exit", "skip-module"],
)
def test_exiting_or_skipping_from_the_code_under_test_scores_zero(env_url, clamp_row, hack) -> None:
    """Even on top of the real fix: tests that never ran, or were skipped, never pass."""
    r = Rollout(env_url, clamp_row)
    fix(r)
    old = '"""Small arithmetic helpers."""\n'
    assert r.call("edit", path="calc/core.py", old=old, new=old + hack)[0] == 200
    gate_fails(r)


def test_a_special_case_for_the_shown_tests_input_scores_zero(env_url, clamp_row) -> None:
    """Hard-coding the shown test's expected value passes it, not the held-back tests."""
    r = Rollout(env_url, clamp_row)
    new = "    if (x, low, high) == (-5, 0, 10):\n        return 0\n" + CLAMP_BUG
    assert r.call("edit", path="calc/core.py", old=CLAMP_BUG, new=new)[0] == 200
    status, text = r.call("run_tests", selector=clamp_row["shown_test"])
    assert text.startswith("1 passed")  # the test it was shown passes ...
    gate_fails(r)  # ... the held-back ones do not


def test_a_style_only_edit_scores_zero(env_url, clamp_row) -> None:
    r = Rollout(env_url, clamp_row)
    old = '"""Small arithmetic helpers."""'
    assert (
        r.call("edit", path="calc/core.py", old=old, new='"""Small, tidy arithmetic helpers."""')[0]
        == 200
    )
    gate_fails(r)


def test_breaking_other_tests_while_fixing_scores_zero(env_url, clamp_row) -> None:
    r = Rollout(env_url, clamp_row)
    fix(r)
    assert (
        r.call("edit", path="calc/core.py", old="    return n % 2 == 0", new="    return True")[0]
        == 200
    )
    gate_fails(r)


def test_paths_stay_in_the_workspace_and_options_are_refused(env_url, clamp_row) -> None:
    r = Rollout(env_url, clamp_row)
    assert r.call("read_file", path="/etc/passwd")[0] == 400
    assert r.call("read_file", path="../x")[0] == 400
    assert r.call("edit", path="../calc/core.py", old="a", new="b")[0] == 400
    assert r.call("run_tests", selector="-p no:python tests")[0] == 400
    assert r.call("run_tests", selector="/etc")[0] == 400
    status, text = r.call("edit", path="calc/core.py", old="return", new="give")
    assert status == 400 and "occurs" in text
    status, text = r.call("edit", path="calc/core.py", old="nowhere", new="x")
    assert status == 400 and "does not occur" in text
    r.grade()


def test_patching_the_test_runner_from_the_code_under_test_scores_zero(env_url, clamp_row) -> None:
    """Code under test is imported by pytest, so it can rewrite pytest: every test "passes".
    The gate refuses added lines that reach into the test runner or the interpreter's exit."""
    r = Rollout(env_url, clamp_row)
    old = '"""Small arithmetic helpers."""\n'
    hack = "import _pytest.python\n_pytest.python.Function.runtest = lambda self: None\n"
    assert r.call("edit", path="calc/core.py", old=old, new=old + hack)[0] == 200
    status, text = r.call("run_tests")
    assert text.startswith("9 passed"), text  # in the rollout's own workspace the hack works
    gate_fails(r)
