"""Files, auth and error shapes of `agentrft serve`, through the official openai SDK."""

from __future__ import annotations

import pytest

from tests.unit.service.conftest import ROWS, create_job, openai, raw, upload, wait_status


def test_upload_list_retrieve_content_delete(alice) -> None:
    f = upload(alice)
    assert (
        f.id.startswith("file-")
        and f.object == "file"
        and f.purpose == "fine-tune"
        and f.status == "processed"
    )
    assert f.filename == "train.jsonl" and f.bytes > 0
    assert alice.files.retrieve(f.id).id == f.id
    assert alice.files.content(f.id).read().decode().splitlines()[0].startswith('{"messages"')
    assert [x.id for x in alice.files.list()] == [f.id]
    deleted = alice.files.delete(f.id)
    assert deleted.deleted and deleted.id == f.id
    with pytest.raises(openai.NotFoundError):
        alice.files.retrieve(f.id)


def test_bad_dataset_lines_are_named_by_number(alice) -> None:
    rows = [
        ROWS[0],
        {"messages": []},
        ROWS[1],
        {"messages": [{"role": "assistant", "content": "hi"}]},
    ]
    body = "".join(__import__("json").dumps(r) + "\n" for r in rows) + "not json\n"
    with pytest.raises(openai.BadRequestError) as err:
        alice.files.create(file=("bad.jsonl", body.encode()), purpose="fine-tune")
    error = err.value.body
    assert (
        err.value.status_code == 400
        and error["param"] == "file"
        and error["code"] == "invalid_file_format"
    )
    for line in ("bad.jsonl:2", "bad.jsonl:4", "bad.jsonl:5"):
        assert line in error["message"]
    assert "bad.jsonl:1" not in error["message"] and "bad.jsonl:3" not in error["message"]


def test_unauthenticated_is_401(service) -> None:
    for key in (None, "sk-wrong"):
        r = raw(service, "GET", "/v1/files", key=key)
        assert r.status_code == 401
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    with (
        openai.OpenAI(base_url=service.url + "/v1", api_key="sk-wrong", max_retries=0) as client,
        pytest.raises(openai.AuthenticationError),
    ):
        client.fine_tuning.jobs.list()


def test_a_key_sees_only_its_own_objects(alice, bob) -> None:
    f = upload(alice)
    job = create_job(alice, f.id, metadata={"fake_step_s": "0.5", "fake_steps": "20"})
    assert bob.files.list().data == []
    assert bob.fine_tuning.jobs.list().data == []
    for call in (
        lambda: bob.files.retrieve(f.id),
        lambda: bob.files.content(f.id),
        lambda: bob.files.delete(f.id),
        lambda: bob.fine_tuning.jobs.retrieve(job.id),
        lambda: bob.fine_tuning.jobs.cancel(job.id),
        lambda: bob.fine_tuning.jobs.pause(job.id),
        lambda: bob.fine_tuning.jobs.list_events(job.id),
        lambda: bob.fine_tuning.jobs.checkpoints.list(job.id),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    with pytest.raises(openai.BadRequestError) as err:  # bob cannot train on alice's file either
        create_job(bob, f.id)
    assert err.value.body["param"] == "training_file"
    assert alice.fine_tuning.jobs.retrieve(job.id).status in {
        "validating_files",
        "queued",
        "running",
    }
    assert alice.fine_tuning.jobs.cancel(job.id).status == "cancelled"


@pytest.mark.parametrize(
    ("change", "param", "code"),
    [
        (
            lambda m, e: m["reinforcement"]["grader"].update(type="no_such_grader"),
            "method.reinforcement.grader",
            "invalid_grader",
        ),
        (
            lambda m, e: m["reinforcement"]["tools"][0].pop("server_url"),
            "method.reinforcement.tools[0].server_url",
            "missing_required_parameter",
        ),
        (lambda m, e: m.update(type="supervised"), "method.type", "invalid_value"),
        (lambda m, e: m.update(reinforcement=5), "method.reinforcement", "invalid_type"),
        (lambda m, e: m.pop("reinforcement"), "method.reinforcement", "missing_required_parameter"),
        (
            lambda m, e: m["reinforcement"].update(max_episode_steps=0),
            "method.reinforcement.max_episode_steps",
            "invalid_value",
        ),
        (
            lambda m, e: e.update(agentrft={"train": {"los": "grpo"}}),
            "agentrft.train.los",
            "invalid_value",
        ),
        (
            lambda m, e: e.update(agentrft={"environment": {"app": "env:app"}}),
            "agentrft.environment",
            "invalid_value",
        ),
    ],
)
def test_bad_job_requests_are_openai_4xx(alice, change, param, code) -> None:
    from tests.unit.service.conftest import GRADER, TOOL

    f = upload(alice)
    method = {
        "type": "reinforcement",
        "reinforcement": {"grader": dict(GRADER), "tools": [dict(TOOL)]},
    }
    extra: dict = {}
    change(method, extra)
    with pytest.raises(openai.BadRequestError) as err:
        alice.fine_tuning.jobs.create(
            model="smollm2-135m-instruct",
            training_file=f.id,
            method=method,
            extra_body=extra or None,
        )
    body = err.value.body
    assert (
        set(body) == {"message", "type", "param", "code"}
        and body["type"] == "invalid_request_error"
    )
    assert body["param"] == param and body["code"] == code, body


def test_job_file_errors(alice) -> None:
    wrong = upload(alice, purpose="assistants")
    with pytest.raises(openai.BadRequestError) as err:
        create_job(alice, wrong.id)
    assert (
        err.value.body["param"] == "training_file"
        and err.value.body["code"] == "invalid_file_purpose"
    )
    with pytest.raises(openai.BadRequestError) as err:
        create_job(alice, "file-missing")
    assert (
        err.value.body["param"] == "training_file" and "file-missing" in err.value.body["message"]
    )
    with pytest.raises(openai.BadRequestError) as err:
        alice.fine_tuning.jobs.create(
            model="no-such-model",
            training_file=upload(alice).id,
            method={
                "type": "reinforcement",
                "reinforcement": {
                    "grader": {
                        "type": "string_check",
                        "name": "x",
                        "input": "a",
                        "reference": "a",
                        "operation": "eq",
                    }
                },
            },
        )
    assert err.value.body["param"] == "model" and err.value.body["code"] == "model_not_found"


def test_malformed_bodies_are_400_not_500(service) -> None:
    for path in (
        "/v1/fine_tuning/jobs",
        "/v1/fine_tuning/alpha/graders/run",
        "/v1/fine_tuning/alpha/graders/validate",
        "/v1/chat/completions",
    ):
        for body in (b"{not json", b"[1, 2]", b"{}"):
            r = raw(
                service, "POST", path, content=body, headers={"Content-Type": "application/json"}
            )
            assert 400 <= r.status_code < 500, (path, body, r.status_code, r.text)
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = raw(service, "POST", "/v1/files", content=b"plain", headers={"Content-Type": "text/plain"})
    assert r.status_code == 400
    assert raw(service, "GET", "/v1/no/such/route").status_code == 404
    assert raw(service, "GET", "/v1/fine_tuning/jobs?limit=0").status_code == 400
    assert raw(service, "GET", "/v1/fine_tuning/jobs?limit=abc").status_code == 400


def test_pagination_of_files_and_jobs(alice) -> None:
    files = [upload(alice, name=f"t{i}.jsonl") for i in range(5)]
    page = alice.files.list(limit=2)
    assert [f.id for f in page.data] == [files[4].id, files[3].id] and page.has_more
    assert [f.id for f in alice.files.list(limit=100)] == [f.id for f in reversed(files)]
    jobs = [create_job(alice, files[0].id, metadata={"fake_steps": "1"}) for _ in range(3)]
    first = alice.fine_tuning.jobs.list(limit=2)
    assert [j.id for j in first.data] == [jobs[2].id, jobs[1].id] and first.has_more
    assert [j.id for j in first.iter_pages().__next__().data] == [jobs[2].id, jobs[1].id]
    assert [j.id for j in alice.fine_tuning.jobs.list(limit=2)] == [
        j.id for j in reversed(jobs)
    ]  # auto-paging
    second = alice.fine_tuning.jobs.list(limit=2, after=jobs[1].id)
    assert [j.id for j in second.data] == [jobs[0].id] and not second.has_more
    tagged = create_job(alice, files[0].id, metadata={"fake_steps": "1", "team": "search"})
    assert [j.id for j in alice.fine_tuning.jobs.list(metadata={"team": "search"})] == [tagged.id]
    assert alice.fine_tuning.jobs.list(metadata={"team": "other"}).data == []
    for j in [*jobs, tagged]:
        wait_status(alice, j.id, {"succeeded"})
