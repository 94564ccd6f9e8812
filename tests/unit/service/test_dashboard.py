"""The dashboard's HTML: login by key, the job list, a job's sections and its buttons."""

from __future__ import annotations

import httpx

from tests.unit.service.conftest import KEY_A, KEY_B, create_job, upload, wait_status


def test_dashboard_login_list_job_page_and_buttons(alice, service) -> None:
    done = create_job(alice, upload(alice).id, metadata={"fake_steps": "3"})
    wait_status(alice, done.id, {"succeeded"})
    running = create_job(
        alice, upload(alice).id, metadata={"fake_steps": "100", "fake_step_s": "0.2"}
    )
    wait_status(alice, running.id, {"running"})

    with httpx.Client(base_url=service.url, timeout=30, follow_redirects=True) as browser:
        login = browser.get("/")
        assert login.status_code == 200 and 'name="key"' in login.text and done.id not in login.text
        assert browser.get("/", params={"key": "sk-wrong"}).status_code == 401
        listing = browser.get("/", params={"key": KEY_A})  # sets the cookie
        assert (
            done.id in listing.text
            and running.id in listing.text
            and 'http-equiv="refresh"' in listing.text
        )

        page = browser.get(f"/dashboard/jobs/{done.id}").text  # by cookie from here on
        for sid in (
            "job",
            "reward-curve",
            "pipeline",
            "tool-calls",
            "stop-reasons",
            "trajectories",
        ):
            assert f'<section id="{sid}">' in page, sid
        assert '<img alt="reward curve"' in page and '<img alt="tool calls per rollout"' in page
        assert (
            "final_answer" in page
            and 'class="rollout"' in page
            and "What is the capital of France?" in page
        )
        assert (
            "Cancel" not in page and 'http-equiv="refresh"' not in page
        )  # finished: no buttons, no reloads

        live = browser.get(f"/dashboard/jobs/{running.id}").text
        assert "Pause" in live and "Cancel" in live and 'http-equiv="refresh"' in live
        r = browser.post(f"/dashboard/jobs/{running.id}/pause")
        assert r.status_code == 200 and "Resume" in r.text  # followed the redirect to the job page
        assert alice.fine_tuning.jobs.retrieve(running.id).status == "paused"
        browser.post(f"/dashboard/jobs/{running.id}/cancel")
        assert alice.fine_tuning.jobs.retrieve(running.id).status == "cancelled"

    with httpx.Client(base_url=service.url, timeout=30) as other:
        assert done.id not in other.get("/", params={"key": KEY_B}).text
        assert other.get(f"/dashboard/jobs/{done.id}").status_code == 404
        assert other.post(f"/dashboard/jobs/{done.id}/cancel").status_code == 404
