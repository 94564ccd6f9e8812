"""Jobs of `agentrft serve` through the official openai SDK, run by a fake worker (no model):
statuses, events, checkpoints, cancel/pause/resume, failures, restarts; and the graders API."""

from __future__ import annotations

import time

import pytest

from tests.unit.service.conftest import (
    GRADER,
    KEY_A,
    create_job,
    fake_worker_server,
    openai,
    sdk_client,
    upload,
    wait_status,
)


def test_job_runs_to_succeeded_with_events_and_checkpoints(alice) -> None:
    f = upload(alice)
    job = create_job(alice, f.id, suffix="caps", metadata={"fake_steps": "3"})
    assert (
        job.id.startswith("ftjob-")
        and job.object == "fine_tuning.job"
        and job.status == "validating_files"
    )
    assert (
        job.fine_tuned_model is None
        and job.training_file == f.id
        and job.method.type == "reinforcement"
    )
    done = wait_status(alice, job.id, {"succeeded", "failed"})
    assert done.status == "succeeded" and done.error is None and done.finished_at is not None
    assert done.fine_tuned_model.startswith("ft:smollm2-135m-instruct:agentrft:caps:")
    assert done.hyperparameters.batch_size == 2 and done.hyperparameters.n_epochs == 1

    events = list(alice.fine_tuning.jobs.list_events(job.id, limit=100))
    created = [e.created_at for e in events]
    assert created == sorted(created, reverse=True)  # newest first
    messages = [e.message for e in reversed(events)]
    assert (
        messages[0].startswith("Created fine-tuning job")
        and messages[-1] == "The job has successfully completed"
    )
    metrics = [e for e in reversed(events) if e.type == "metrics"]
    assert [e.data["step"] for e in metrics] == [1, 2, 3]
    assert (
        metrics[0].data["reward/mean"] == pytest.approx(0.1) and metrics[0].data["total_steps"] == 3
    )
    assert "reward=0.1000" in metrics[0].message
    page = alice.fine_tuning.jobs.list_events(job.id, limit=2)
    assert len(page.data) == 2 and page.has_more
    rest = alice.fine_tuning.jobs.list_events(job.id, limit=100, after=page.data[-1].id)
    assert [e.id for e in rest.data] == [e.id for e in events[2:]]

    ckpts = alice.fine_tuning.jobs.checkpoints.list(job.id)
    assert [c.step_number for c in ckpts.data] == [3, 2, 1]
    assert ckpts.data[0].fine_tuned_model_checkpoint == f"{done.fine_tuned_model}:ckpt-step-3"
    assert ckpts.data[0].metrics.step == 3 and ckpts.data[0].fine_tuning_job_id == job.id
    assert [
        c.step_number
        for c in alice.fine_tuning.jobs.checkpoints.list(
            job.id, limit=1, after=ckpts.data[0].id
        ).data
    ] == [2]

    models = [m.id for m in alice.models.list()]
    assert "smollm2-135m-instruct" in models and done.fine_tuned_model in models
    assert alice.models.retrieve(done.fine_tuned_model).id == done.fine_tuned_model
    assert alice.models.delete(done.fine_tuned_model).deleted
    assert done.fine_tuned_model not in [m.id for m in alice.models.list()]
    with pytest.raises(openai.NotFoundError):
        alice.chat.completions.create(
            model=done.fine_tuned_model, messages=[{"role": "user", "content": "hi"}]
        )
    with pytest.raises(openai.PermissionDeniedError):
        alice.models.delete("smollm2-135m-instruct")


def test_failed_job_carries_openai_error(alice) -> None:
    job = create_job(
        alice, upload(alice).id, metadata={"fake_fail": "step 1: 16 rollouts discarded"}
    )
    done = wait_status(alice, job.id, {"succeeded", "failed"})
    assert done.status == "failed" and done.fine_tuned_model is None
    assert done.error.code == "training_aborted" and "16 rollouts discarded" in done.error.message
    assert any(e.level == "error" for e in alice.fine_tuning.jobs.list_events(job.id))


def test_cancel_stops_the_worker_within_seconds_and_keeps_checkpoints(alice, service) -> None:
    job = create_job(alice, upload(alice).id, metadata={"fake_steps": "100", "fake_step_s": "0.2"})
    wait_status(alice, job.id, {"running"})
    deadline = time.monotonic() + 20
    while not alice.fine_tuning.jobs.checkpoints.list(job.id).data:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    t0 = time.monotonic()
    cancelled = alice.fine_tuning.jobs.cancel(job.id)
    assert cancelled.status == "cancelled" and time.monotonic() - t0 < 5
    n = len(alice.fine_tuning.jobs.checkpoints.list(job.id, limit=100).data)
    time.sleep(0.5)
    assert (
        n >= 1 and len(alice.fine_tuning.jobs.checkpoints.list(job.id, limit=100).data) == n
    )  # kept, and nothing runs
    with pytest.raises(openai.BadRequestError):
        alice.fine_tuning.jobs.cancel(job.id)


def test_pause_and_resume_continue_from_the_checkpoint(alice) -> None:
    job = create_job(alice, upload(alice).id, metadata={"fake_steps": "6", "fake_step_s": "0.3"})
    wait_status(alice, job.id, {"running"})
    while not alice.fine_tuning.jobs.checkpoints.list(job.id).data:
        time.sleep(0.05)
    assert alice.fine_tuning.jobs.pause(job.id).status == "paused"
    with pytest.raises(openai.BadRequestError):
        alice.fine_tuning.jobs.pause(job.id)
    assert alice.fine_tuning.jobs.resume(job.id).status in {
        "queued",
        "running",
    }  # running once a worker took it
    done = wait_status(alice, job.id, {"succeeded", "failed"})
    assert done.status == "succeeded"
    steps = [
        e.data["step"]
        for e in reversed(list(alice.fine_tuning.jobs.list_events(job.id, limit=100)))
        if e.type == "metrics"
    ]
    assert steps == [1, 2, 3, 4, 5, 6]
    messages = [e.message for e in alice.fine_tuning.jobs.list_events(job.id, limit=100)]
    assert "Fine-tuning job resumed from its last checkpoint" in messages


def test_a_restart_loses_no_job(tmp_path, monkeypatch) -> None:
    server = fake_worker_server(tmp_path / "data", monkeypatch, api_keys=frozenset({KEY_A}))
    with sdk_client(server, KEY_A) as client:
        job = create_job(
            client, upload(client).id, metadata={"fake_steps": "5", "fake_step_s": "0.3"}
        )
        queued = create_job(client, upload(client).id, metadata={"fake_steps": "1"})
        wait_status(client, job.id, {"running"})
        while not client.fine_tuning.jobs.checkpoints.list(job.id).data:
            time.sleep(0.05)
    server.stop()
    server = fake_worker_server(tmp_path / "data", monkeypatch, api_keys=frozenset({KEY_A}))
    try:
        with sdk_client(server, KEY_A) as client:
            assert wait_status(client, job.id, {"succeeded", "failed"}).status == "succeeded"
            assert wait_status(client, queued.id, {"succeeded", "failed"}).status == "succeeded"
            events = list(client.fine_tuning.jobs.list_events(job.id, limit=100))
            assert [e.data["step"] for e in reversed(events) if e.type == "metrics"] == [
                1,
                2,
                3,
                4,
                5,
            ]
            assert any("server restarted" in e.message for e in events)
    finally:
        server.stop()


def test_graders_validate_and_run(alice) -> None:
    assert alice.fine_tuning.alpha.graders.validate(grader=GRADER).grader is not None
    with pytest.raises(openai.BadRequestError) as err:
        alice.fine_tuning.alpha.graders.validate(grader={"type": "no_such_grader", "name": "x"})
    assert err.value.body["param"] == "grader"
    hit = alice.fine_tuning.alpha.graders.run(
        grader=GRADER, model_sample="The capital is paris.", item={"answer": "Paris"}
    )
    assert (
        hit.reward == 1.0 and hit.metadata.name == "answer" and hit.metadata.type == "string_check"
    )
    assert not any(v for k, v in hit.metadata.errors.model_dump().items() if isinstance(v, bool))
    miss = alice.fine_tuning.alpha.graders.run(
        grader=GRADER, model_sample="Lyon", item={"answer": "Paris"}
    )
    assert miss.reward == 0.0
    missing = alice.fine_tuning.alpha.graders.run(grader=GRADER, model_sample="Paris", item={})
    assert missing.metadata.errors.invalid_variable_error


def test_workers_do_not_inherit_the_api_keys(monkeypatch) -> None:
    from agentrft.service.executor import worker_environment

    monkeypatch.setenv("AGENTRFT_API_KEYS", "sk-secret")
    monkeypatch.setenv("AGENTRFT_CACHE", "/somewhere")
    env = worker_environment()
    assert "AGENTRFT_API_KEYS" not in env and env["AGENTRFT_CACHE"] == "/somewhere"


def test_a_job_whose_tools_come_from_an_mcp_server_url(alice, service, tmp_path) -> None:
    from agentrft.tools.envkit import ToolServer, serve_in_thread

    env = ToolServer("service-mcp")

    @env.tool(description="Look up a country.")
    def lookup_country(ctx, country: str) -> str:
        return "capital: Paris"

    with serve_in_thread(env.app) as url:
        job = alice.fine_tuning.jobs.create(
            model="smollm2-135m-instruct",
            training_file=upload(alice).id,
            method={"type": "reinforcement", "reinforcement": {"grader": GRADER, "tools": []}},
            metadata={"fake_list_tools": "1"},
            extra_body={"agentrft": {"mcp_servers": [{"url": url + "/mcp"}]}},
        )
        done = wait_status(alice, job.id, {"succeeded", "failed"})
    assert done.status == "succeeded", done.error
    run_dir = service.data_dir / "jobs" / job.id
    assert (run_dir / "tools.json").read_text() == '["lookup_country"]'  # listed by the worker

    for server, param in (
        ({"command": ["python", "server.py"]}, "agentrft.mcp_servers[0].command"),
        ({"url": "/mcp"}, "agentrft.mcp_servers[0].url"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            alice.fine_tuning.jobs.create(
                model="smollm2-135m-instruct",
                training_file=upload(alice).id,
                method={"type": "reinforcement", "reinforcement": {"grader": GRADER}},
                extra_body={"agentrft": {"mcp_servers": [server]}},
            )
        assert err.value.body["param"] == param
