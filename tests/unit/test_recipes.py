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


def _stub_stages(monkeypatch, verdicts: dict[str, str]) -> list[str]:
    """The runner's stages without a model: each eval writes one rollout per row whose
    reward says which variant and model made it; the pre-flight of a variant (told by its
    output folder) gives `verdicts[name]`; training records what it trained."""
    import json
    from pathlib import Path

    trained: list[str] = []

    def evaluate_model(job, items, k, model, out, label):
        out.mkdir(parents=True, exist_ok=True)
        reward = 0.8 if model != "base" else 0.2
        rows = [{"row": i, "reward": reward, "messages": []} for i, _ in enumerate(items)]
        (out / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return {"reward": {"mean": reward}}

    def preflight_job(job, items, k, out):
        name = Path(out).parent.name  # the variant's folder (the demo's own when it has one)
        evaluate_model(job, items, k, "base", out, "pre-flight")
        return {
            "eval": {"reward": {"mean": 0.2}},
            "verdict": verdicts.get(name, verdicts["*"]),
            "rows_with_signal": 0.5,
            "best_of_k": {},
        }

    def train(job, out):
        trained.append(Path(out).parent.name)
        out.mkdir(parents=True)
        (out / "metrics.jsonl").write_text('{"step": 1}\n')
        return out

    monkeypatch.setattr(recipes, "evaluate_model", evaluate_model)
    monkeypatch.setattr(recipes, "preflight_job", preflight_job)
    monkeypatch.setattr(recipes, "train", train)
    monkeypatch.setattr(recipes, "print_preflight", lambda rep: None)
    monkeypatch.setattr(recipes, "print_compare", lambda *a: None)
    monkeypatch.setattr(recipes, "summary_table", lambda *a, **k: "")
    monkeypatch.setattr(recipes, "write_report", lambda path, **k: path)

    def doctor_job(job, items, k, out, train_items, preflight_out=None):
        rep = {"checks": [{"rule": "best-of-k rises", "status": "pass"}]}
        if preflight_out is not None:  # the doctor's base rollouts are the pre-flight's
            rep["preflight"] = preflight_job(job, items, k, preflight_out)
        return rep

    monkeypatch.setattr(recipes, "doctor_job", doctor_job)
    monkeypatch.setattr(recipes, "doctor_table", lambda rep: "")
    return trained


def _variant_recipe(tmp_path, variants):
    import json
    from types import SimpleNamespace

    def build_data(data):
        row = json.dumps({"messages": [{"role": "user", "content": "q"}]}) + "\n"
        for v in variants:
            (data.parent / v.data).mkdir(parents=True, exist_ok=True)
            for split, n in (("train", 6), ("val", 3)):
                (data.parent / v.data / f"{split}.jsonl").write_text(row * n)
        return SimpleNamespace(train=6, val=3, lines=lambda: [])

    def fake_job(folder, data, out, steps, seed, job_path):
        return SimpleNamespace(source=job_path, seed=seed)

    return recipes.Recipe(
        title="t",
        folder=tmp_path,
        build_data=build_data,
        metric="reward",
        row_scores=lambda records: {r["row"]: r["reward"] for r in records},
        headline=lambda res, records, job: {"reward": res["reward"]["mean"]},
        expected=str,
        variants=variants,
        variant_job=fake_job,
    )


def test_the_runner_trains_the_first_variant_with_signal_and_still_measures_measure_only_ones(
    tmp_path, monkeypatch
):
    trained = _stub_stages(
        monkeypatch,
        {"task": "no_reward", "easier": "weak_signal", "hint": "learnable", "*": "broken"},
    )
    variants = (
        recipes.Variant("task", "job.yaml", "data"),
        recipes.Variant("easier", "job_easy.yaml", "data-easy"),
        recipes.Variant("easiest", "job_x.yaml", "data-x"),  # skipped: one is already trained
        recipes.Variant("hint", "job_hint.yaml", "data-hint", train=False),
    )
    summary = recipes.run(_variant_recipe(tmp_path, variants), tmp_path / "out", seed=3)
    assert trained == ["easier"] and summary["trained"] == "easier"
    assert list(summary["variants"]) == ["task", "easier", "hint"]
    assert summary["variants"]["task"]["signal"] is False
    # no signal and an easier variant next: the held-out baseline is not sampled
    assert summary["variants"]["task"]["baseline"] is None
    assert not (tmp_path / "out/task/baseline").exists()
    assert summary["variants"]["easier"]["baseline"] == {"reward": 0.2}
    assert summary["variants"]["hint"]["signal"] is True  # measured, never trained
    assert summary["variants"]["hint"]["baseline"] == {"reward": 0.2}
    assert all(v["doctor"] == {"best-of-k rises": "pass"} for v in summary["variants"].values())
    assert summary["per_row"]["difference"]["mean"] == pytest.approx(0.6)
    assert summary["job"] == str(tmp_path / "job_easy.yaml") and summary["seed"] == 3


def test_doctor_only_runs_the_doctor_on_every_variant_and_nothing_else(tmp_path, monkeypatch):
    trained = _stub_stages(monkeypatch, {"*": "learnable"})
    monkeypatch.setattr(recipes, "evaluate_model", lambda *a, **k: pytest.fail("no baseline"))
    variants = (recipes.Variant("task"), recipes.Variant("easier", "job_easy.yaml", "data-easy"))
    summary = recipes.run(_variant_recipe(tmp_path, variants), tmp_path / "out", doctor_only=True)
    assert trained == [] and summary["trained"] is None
    assert list(summary["variants"]) == ["task", "easier"]
    assert summary["variants"]["easier"]["doctor"] == {"best-of-k rises": "pass"}


def test_the_runner_trains_nothing_when_no_pre_flight_finds_signal(tmp_path, monkeypatch):
    trained = _stub_stages(monkeypatch, {"*": "broken"})
    summary = recipes.run(_variant_recipe(tmp_path, (recipes.Variant(),)), tmp_path / "out")
    assert trained == [] and summary["trained"] is None
    # the last (here the only) variant keeps its baseline: nothing is measured after it
    assert summary["variants"]["task"]["baseline"] == {"reward": 0.2}
    assert "nothing trained" in summary["verdict"] and "per_row" not in summary
    seeds = recipes.run_seeds(_variant_recipe(tmp_path, (recipes.Variant(),)), tmp_path, [1])
    assert "nothing trained" in seeds["verdict"]


def test_only_measures_and_trains_the_named_variant(tmp_path, monkeypatch):
    trained = _stub_stages(monkeypatch, {"*": "learnable"})
    variants = (recipes.Variant("task"), recipes.Variant("repair", "job_repair.yaml", "data-r"))
    recipe = _variant_recipe(tmp_path, variants)
    summary = recipes.run(recipe, tmp_path / "out", only="repair")
    assert trained == ["repair"] and list(summary["variants"]) == ["repair"]
    with pytest.raises(ConfigError, match="no variant 'easy' -> one of: task, repair"):
        recipes.run(recipe, tmp_path / "out2", only="easy")
    seeds = recipes.run_seeds(recipe, tmp_path / "seeds", [1, 2], only="repair")
    assert trained == ["repair"] * 3 and set(seeds["seeds"]) == {"1", "2"}


def test_the_pre_flight_reads_the_doctors_rollouts_when_it_samples_as_many_per_row(
    tmp_path, monkeypatch
):
    import dataclasses

    trained = _stub_stages(monkeypatch, {"*": "learnable"})
    sampled = []
    doctor = recipes.doctor_job

    def counting_doctor(job, items, k, out, train_items, preflight_out=None):
        sampled.append(("doctor", k, preflight_out is not None))
        return doctor(job, items, k, out, train_items, preflight_out)

    pre = recipes.preflight_job
    monkeypatch.setattr(recipes, "doctor_job", counting_doctor)
    recipe = dataclasses.replace(_variant_recipe(tmp_path, (recipes.Variant(),)), preflight_k=4)
    summary = recipes.run(recipe, tmp_path / "out")
    assert sampled == [("doctor", 4, True)] and trained == ["out"]
    assert summary["variants"]["task"]["preflight"]["verdict"] == "learnable"
    assert (tmp_path / "out/preflight/rollouts.jsonl").exists()  # where the report reads it
    # a pre-flight that samples more per row than the doctor samples on its own
    sampled.clear()
    monkeypatch.setattr(
        recipes, "preflight_job", lambda *a: sampled.append(("preflight", a[2])) or pre(*a)
    )
    recipes.run(dataclasses.replace(recipe, preflight_k=8), tmp_path / "out2")
    assert sampled == [("doctor", 4, False), ("preflight", 8)]
