"""GitLab's webhooks into ``phasegate serve``: the fake GitLab delivers a note as
GitLab does (``X-Gitlab-Token`` the hook's secret token, from a thread of its
own), ``/webhooks/gitlab`` checks the token and wakes the workflow the note
concerns. Polling is set to an hour: only a delivery can move the workflow.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.web.serve import Dashboard

from gitlab_forge_kit import TEAM, gitlab, team_project
from support.gitlab_lab import Lab
from support.hook_serving import SECRET, SLOW, Build, serving, wait_for

__all__ = ["gitlab"]  # a fixture, used by name


@pytest.fixture
def hooked(
    gitlab: Lab, tmp_path: Path, engine_for: Build, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Engine, Store, Dashboard]]:
    """acme/widgets with its engine and store, and ``phasegate serve`` (dashboard
    and worker) with the webhook's secret token set."""
    monkeypatch.setenv("PHASEGATE_WEBHOOK_SECRET", SECRET)
    repo, _ = team_project(gitlab, tmp_path, auto_merge=False, forge_extra=SLOW)
    yield from serving(engine_for, repo)


def test_a_developers_merge_request_note_by_webhook_starts_round_two_without_a_poll(
    gitlab: Lab, hooked: tuple[Engine, Store, Dashboard]
) -> None:
    engine, store, dashboard = hooked
    gl = gitlab.gl
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row["error"]
    url = dashboard.start()
    hook = gl.hooks.add(TEAM, f"{url}/webhooks/gitlab", SECRET, ("note_events",))
    mr = gl.project(TEAM).merge_requests[1]

    gl.comment(mr, gl.users["dev"], "Also say what the feature is for.")
    took = wait_for(lambda: store.workflow_row(workflow_id)["dev_round"] == 2)
    [delivered] = gl.hooks.wait_all()
    assert (delivered.event, delivered.status) == ("Note Hook", 202)
    # Polled hourly, the workflow moves within seconds only by the delivery. How fast it
    # wakes is benchmarks/wakeup.py's figure: a loaded CI machine measured 1.4 s here.
    assert took < 5.0, f"round 2 began {took:.2f} s after the note"
    assert store.last_delivery_at(TEAM) is not None

    # The same body again is a replay, whatever event id its headers claim.
    again = {**delivered.headers, "X-Gitlab-Event-UUID": "another-id"}
    before = store.workflow_row(workflow_id)
    with httpx.Client(base_url=url) as client:
        replayed = client.post("/webhooks/gitlab", content=delivered.body, headers=again)
        wrong = client.post(
            "/webhooks/gitlab",
            content=delivered.body.replace(b"Also", b"Then"),
            headers={**delivered.headers, "X-Gitlab-Token": "guessed"},
        )
        bare = client.post(
            "/webhooks/gitlab",
            content=delivered.body.replace(b"Also", b"Now"),
            headers={k: v for k, v in delivered.headers.items() if k != "X-Gitlab-Token"},
        )
    assert (replayed.status_code, wrong.status_code, bare.status_code) == (403, 401, 401)
    time.sleep(0.3)
    after = store.workflow_row(workflow_id)
    assert (after["dev_round"], after["due_at"]) == (before["dev_round"], before["due_at"])
    assert hook.token == SECRET


def test_a_guests_label_is_logged_once_however_many_deliveries_follow(
    gitlab: Lab, hooked: tuple[Engine, Store, Dashboard], caplog: pytest.LogCaptureFixture
) -> None:
    """Each label delivery has serve look at every labelled issue; a Guest's label
    on one is reported once, as ``phasegate watch`` reports it, not per delivery."""
    caplog.set_level(logging.WARNING)
    engine, store, dashboard = hooked
    dashboard.worker = False
    url = dashboard.start()
    gl = gitlab.gl
    gitlab.gl.hooks.add(TEAM, f"{url}/webhooks/gitlab", SECRET, ("issues_events",))
    first = gl.open_issue(TEAM, "guest", "One", "Write one.txt.")
    second = gl.open_issue(TEAM, "guest", "Two", "Write two.txt.")
    gl.label(TEAM, first.iid, "phasegate", by="guest")
    gl.label(TEAM, second.iid, "phasegate", by="guest")
    assert {d.status for d in gl.hooks.wait_all()} == {202}
    ignored = [r.getMessage() for r in caplog.records if " ignored: " in r.getMessage()]
    assert sorted(ignored) == [
        f"{TEAM}#{n} ignored: labelled 'phasegate' by guest, whose role is Guest: only "
        "Developer, Maintainer or Owner starts a workflow"
        for n in (first.iid, second.iid)
    ]
    assert store.list_workflows() == []
