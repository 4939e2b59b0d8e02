"""Webhooks into ``phasegate serve``: the fake GitHub delivers what happens on the
repository as GitHub does (signed with the hook's secret, from a thread of its
own), the dashboard's ``/webhooks/github`` verifies each delivery and wakes the
workflow it concerns. Polling is set to an hour throughout: only a delivery can
move a workflow within a test.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from phasegate.core.contract import PhaseResult
from phasegate.integrations.webhooks import WebhookRefused, concerns, verify
from phasegate.runtime.engine import Engine
from phasegate.runtime.pace import ForgePace
from phasegate.store import Store, open_store
from phasegate.store.values import WOKEN_AT
from phasegate.testing import FixedClock
from phasegate.web.serve import Dashboard

from conftest import GitHubLab
from github_forge_kit import team_repo
from support.hook_serving import SECRET, SLOW, Build, serving, wait_for


@pytest.fixture
def hooked(
    github: GitHubLab, tmp_path: Path, engine_for: Build, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Engine, Store, Dashboard]]:
    """octo/widgets with a waiting workflow's repository, its engine and store, and
    ``phasegate serve`` (dashboard and worker) with the webhook's secret set."""
    monkeypatch.setenv("PHASEGATE_WEBHOOK_SECRET", SECRET)
    repo, _ = team_repo(github, tmp_path, auto_merge=False, forge_extra=SLOW)
    yield from serving(engine_for, repo)


def signed(body: bytes, secret: str = SECRET) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def test_a_maintainers_comment_delivered_by_webhook_starts_round_two_with_no_poll(
    github: GitHubLab, hooked: tuple[Engine, Store, Dashboard]
) -> None:
    engine, store, dashboard = hooked
    gh, name = github.server, github.repository
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row["error"]
    url = dashboard.start()
    gh.hooks.add(name, f"{url}/webhooks/github", SECRET, ("issue_comment",))
    looks = len([r for r in gh.requests if r.path.endswith("/comments")])

    gh.comment(name, row["pr_number"], "Also say what the feature is for.", by="maya")
    took = wait_for(lambda: store.workflow_row(workflow_id)["dev_round"] == 2)
    [delivered] = gh.hooks.wait_all()
    assert (delivered.event, delivered.status) == ("issue_comment", 202), delivered.answer
    assert json.loads(delivered.answer)["woke"] == [workflow_id]
    # The worker looked at the forge only once the delivery woke it.
    assert len([r for r in gh.requests if r.path.endswith("/comments")]) > looks
    assert took < 10.0 and store.last_delivery_at(name) is not None

    # The same signed body again is a replay, whatever delivery id it claims.
    again = gh.hooks.redeliver(delivered)
    assert again.status == 403 and "delivered before" in again.answer
    forged_headers = {**delivered.headers, "X-GitHub-Delivery": "another-id"}
    with httpx.Client(base_url=url) as client:
        replayed = client.post("/webhooks/github", content=delivered.body, headers=forged_headers)
    assert replayed.status_code == 403


def test_a_forged_or_unsigned_delivery_is_refused_and_wakes_nothing(
    github: GitHubLab, hooked: tuple[Engine, Store, Dashboard]
) -> None:
    engine, store, dashboard = hooked
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    dashboard.worker = False
    url = dashboard.start()
    store.schedule(workflow_id, row["version"], 3600)
    due = store.workflow_row(workflow_id)["due_at"]
    payload = {
        "action": "created",
        "issue": {"number": row["pr_number"]},
        "comment": {"body": "merge it"},
        "repository": {"full_name": github.repository},
    }
    body = json.dumps(payload).encode()
    headers = {"X-GitHub-Event": "issue_comment", "X-GitHub-Delivery": "d-1"}
    with httpx.Client(base_url=url) as client:
        unsigned = client.post("/webhooks/github", content=body, headers=headers)
        forged = client.post(
            "/webhooks/github",
            content=body,
            headers={**headers, "X-Hub-Signature-256": signed(body, "guessed")},
        )
        other_forge = client.post(
            "/webhooks/gitlab", content=body, headers={"X-Gitlab-Token": SECRET}
        )
        assert store.workflow_row(workflow_id)["due_at"] == due  # nothing woke
        good = client.post(
            "/webhooks/github",
            content=body,
            headers={**headers, "X-Hub-Signature-256": signed(body)},
        )
    assert (unsigned.status_code, forged.status_code, other_forge.status_code) == (401, 401, 404)
    assert "does not match" in forged.json()["detail"]
    assert good.status_code == 202 and good.json()["woke"] == [workflow_id]
    assert store.workflow_row(workflow_id)["due_at"] == WOKEN_AT  # due now


def test_a_trusted_label_delivered_by_webhook_starts_its_workflow_and_an_untrusted_one_not(
    github: GitHubLab, hooked: tuple[Engine, Store, Dashboard]
) -> None:
    engine, store, dashboard = hooked
    gh, name = github.server, github.repository
    dashboard.worker = False
    url = dashboard.start()
    gh.hooks.add(name, f"{url}/webhooks/github", SECRET, ("issues",))
    issue = gh.open_issue(name, "Add the feature", "Write feature.txt.", by="olga")
    gh.label(name, issue.number, "phasegate", by="rex")  # read permission only
    [ignored] = gh.hooks.wait_all()
    assert ignored.status == 202 and json.loads(ignored.answer)["started"] == []
    gh.unlabel(name, issue.number, "phasegate", by="maya")
    gh.label(name, issue.number, "phasegate", by="maya")
    started = gh.hooks.wait_all()[-1]
    [workflow_id] = json.loads(started.answer)["started"]
    assert store.workflow_row(workflow_id)["issue_number"] == issue.number


def test_webhooks_slow_the_polling_down_to_its_fallback(
    github: GitHubLab, tmp_path: Path, engine_for: Build
) -> None:
    repo, _ = team_repo(github, tmp_path, forge_extra="poll_s = 2\nwebhook_poll_s = 600\n")
    engine, store = engine_for(repo)
    ticks = iter(range(0, 10_000, 40))  # each look is 40 s after the last
    pace = ForgePace(engine.cartridge, store, github.repository, lambda: float(next(ticks)))
    assert pace.wait_s() == 2
    store.record_delivery(
        "ab" * 32, forge="github", delivery="x", event="ping", repository=github.repository,
        keep_s=60,
    )  # fmt: skip
    assert pace.wait_s() == 600
    other = ForgePace(engine.cartridge, store, "octo/other", lambda: 0.0)
    assert other.wait_s() == 2


def test_each_forges_signature_scheme_and_what_a_gitlab_delivery_concerns() -> None:
    body = b'{"x": 1}'
    verify("github", {"X-Hub-Signature-256": signed(body)}, body, SECRET)
    verify("gitlab", {"X-Gitlab-Token": SECRET}, body, SECRET)
    gitea = hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    verify("gitea", {"X-Gitea-Signature": gitea}, body, SECRET)
    verify("gitea", {"X-Forgejo-Signature": gitea}, body, SECRET)
    for forge, headers in (
        ("github", {"X-Hub-Signature-256": signed(body, "nope")}),
        ("gitlab", {"X-Gitlab-Token": "nope"}),
        ("gitea", {"X-Gitea-Signature": signed(body)}),  # GitHub's form is not Gitea's
    ):
        with pytest.raises(WebhookRefused) as refused:
            verify(forge, headers, body, SECRET)
        assert refused.value.status == 401

    note = {
        "project": {"path_with_namespace": "team/app"},
        "object_attributes": {"note": "/phasegate merge", "noteable_type": "MergeRequest"},
        "merge_request": {"iid": 7, "source_branch": "phasegate/wf-1"},
    }
    about = concerns("gitlab", "Note Hook", note)
    assert (about.repository, about.numbers, about.branches) == (
        "team/app",
        frozenset({1_000_007}),  # merge request !7 is phasegate's 1000007
        frozenset({"phasegate/wf-1"}),
    )
    labelled = {
        "project": {"path_with_namespace": "team/app"},
        "object_attributes": {"iid": 3},
        "changes": {
            "labels": {
                "previous": [{"title": "bug"}],
                "current": [{"title": "bug"}, {"title": "phasegate"}],
            }
        },
    }
    assert concerns("gitlab", "Issue Hook", labelled).label == "phasegate"
    with pytest.raises(WebhookRefused):
        concerns("github", "issue_comment", {"issue": {"number": 1}})


def test_a_trusted_command_delivered_by_webhook_is_applied_at_once_and_an_outsiders_not(
    github: GitHubLab, hooked: tuple[Engine, Store, Dashboard]
) -> None:
    engine, store, dashboard = hooked
    gh, name = github.server, github.repository
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    dashboard.worker = False  # no worker, no watcher: only the delivery acts
    url = dashboard.start()
    gh.hooks.add(name, f"{url}/webhooks/github", SECRET, ("issue_comment",))
    gh.comment(name, row["pr_number"], "/phasegate cancel", by="rex")  # read permission
    [outsider] = gh.hooks.wait_all()
    assert json.loads(outsider.answer)["commanded"] == []
    assert store.workflow_row(workflow_id)["status"] == "waiting"
    gh.comment(name, row["pr_number"], "/phasegate cancel\n\nNot needed any more.", by="maya")
    maintainer = gh.hooks.wait_all()[-1]
    assert json.loads(maintainer.answer)["commanded"] == [workflow_id]
    assert store.workflow_row(workflow_id)["status"] == "cancelled"
    assert gh.pull(name, row["pr_number"]).state == "closed"  # its own pull request


def test_a_wake_during_a_look_keeps_the_workflow_due_whatever_the_look_commits(
    store_url: str,
) -> None:
    clock = FixedClock()
    store = open_store(store_url, clock)
    try:
        store.record_delivery(
            "cd" * 32, forge="github", delivery="d", event="issue_comment",
            repository="octo/widgets", keep_s=60,
        )  # fmt: skip
        woken, quiet = (
            store.create_workflow(
                title="t", ticket="x", repo_path="/r", base_branch="main", auto_merge=False,
                content_language="en", issue=("octo/widgets", number), repository="octo/widgets",
            )
            for number in (7, 8)
        )  # fmt: skip
        looked = {w: store.load_context(w) for w in (woken, quiet)}  # a look begins
        assert store.wake("octo/widgets", numbers=[7]) == [woken]
        # The look ends in a wait: the quiet one is due in an hour, the woken one now.
        for ctx in looked.values():
            store.commit_phase_result(ctx, PhaseResult("wait", state={"x": 1}), due_in_s=3600)
        assert store.workflow_row(woken)["due_at"] is None
        assert store.workflow_row(quiet)["due_at"] == clock.now() + timedelta(seconds=3600)
        # A look that commits nothing reschedules: a wake meanwhile keeps it due too.
        row = store.workflow_row(quiet)
        store.wake("octo/widgets", numbers=[8])
        assert store.schedule(quiet, row["version"], 3600) == clock.now()
        assert store.workflow_row(quiet)["due_at"] is None
        # A forge pause keeps its own resume time, woken or not.
        store.wake("octo/widgets", numbers=[7])
        paused = store.commit_phase_result(
            store.load_context(woken), PhaseResult("pause", reason="forge_unavailable: x"),
            due_in_s=30,
        )  # fmt: skip
        assert paused["due_at"] == clock.now() + timedelta(seconds=30)
    finally:
        store.close()
