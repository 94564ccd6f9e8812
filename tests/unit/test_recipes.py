"""`agentrft demo NAME` finds recipes on disk: every recipes/NAME/ with a demo.py."""

from __future__ import annotations

import pytest

from agentrft.cli import main
from agentrft.errors import ConfigError
from agentrft.tasks import runner as recipes


def test_the_recipes_in_the_checkout_are_found_and_expose_run():
    names = recipes.available()
    assert recipes.DEFAULT in names
    for name in names:
        assert callable(recipes.load(name).run)


def test_a_new_folder_with_a_demo_is_a_recipe_and_a_wrong_name_lists_them(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "demo.py").write_text(
        "def run(out, steps=None, seed=None, job_path=None):\n    return {'ok': True}\n"
    )
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "demo.py").write_text("x = 1\n")
    assert recipes.available(tmp_path) == ["broken", "mine"]
    assert recipes.load("mine", tmp_path).run(tmp_path) == {"ok": True}
    with pytest.raises(ConfigError, match="no recipe 'nope' -> one of: broken, mine"):
        recipes.load("nope", tmp_path)
    with pytest.raises(
        ConfigError, match=r"defines RECIPE = agentrft.tasks.runner.Recipe\(...\), or run"
    ):
        recipes.load("broken", tmp_path)


def test_demo_with_an_unknown_recipe_is_a_one_line_error(capsys):
    assert main(["demo", "no_such_recipe"]) == 2
    err = capsys.readouterr().err
    assert (
        "no recipe 'no_such_recipe'" in err and "file_selection" in err and "Traceback" not in err
    )


def test_a_recipe_that_only_describes_itself_gets_the_shared_runner(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "demo.py").write_text(
        "from pathlib import Path\n"
        "from agentrft.tasks import runner as recipes\n"
        "RECIPE = recipes.Recipe(title='mine', folder=Path(__file__).parent, build_data=print,\n"
        "    metric='m', row_scores=dict, headline=dict, expected=str)\n"
    )
    module = recipes.load("mine", tmp_path)
    assert module.run.func is recipes.run and module.run.args == (module.RECIPE,)
    assert module.run_seeds.func is recipes.run_seeds
