"""Webhooks from Gitea into ``phasegate serve``: the fake Gitea delivers what
happens on the repository as Gitea does (``X-Gitea-Signature``: the HMAC-SHA256
hex of the body with the hook's secret, from a thread of its own), the
dashboard's ``/webhooks/gitea`` verifies each delivery and wakes the workflow it
concerns. Polling is set to an hour: only a delivery can move a workflow here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from phasegate.runtime.engine import Engine
from phasegate.store import Store
from phasegate.web.serve import Dashboard

from gitea_forge_kit import GiteaLab, gitea, team_repo
from support.hook_serving import SECRET, SLOW, Build, serving, wait_for

__all__ = ["gitea"]


@pytest.fixture
def hooked(
    gitea: GiteaLab, tmp_path: Path, engine_for: Build, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Engine, Store, Dashboard]]:
    """octo/widgets for a workflow, its engine and store, and ``phasegate serve``
    (dashboard and worker) with the webhook's secret set."""
    monkeypatch.setenv("PHASEGATE_WEBHOOK_SECRET", SECRET)
    repo, _ = team_repo(gitea, tmp_path, auto_merge=False, forge_extra=SLOW)
    yield from serving(engine_for, repo)


def test_a_collaborators_pr_comment_delivered_by_gitea_starts_round_two_and_a_replay_not(
    gitea: GiteaLab, hooked: tuple[Engine, Store, Dashboard]
) -> None:
    engine, store, dashboard = hooked
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row["error"]
    url = dashboard.start()
    gitea.server.hooks.add(
        gitea.repository, f"{url}/webhooks/gitea", SECRET, ("pull_request_comment",)
    )

    gitea.comment("maya", row["pr_number"], "Also say what the feature is for.")
    took = wait_for(lambda: store.workflow_row(workflow_id)["dev_round"] == 2)
    [delivered] = gitea.server.hooks.wait_all()
    assert (delivered.event, delivered.status) == ("issue_comment", 202)
    # Polled hourly, the workflow moves within seconds only by the delivery. How fast it
    # wakes is benchmarks/wakeup.py's figure: a loaded CI machine measured 1.4 s here.
    assert took < 5.0, f"the delivery took {took:.2f} s to start round two"
    assert store.last_delivery_at(gitea.repository) is not None
    wait_for(lambda: store.workflow_row(workflow_id)["status"] == "waiting", 30)
    version = store.workflow_row(workflow_id)["version"]

    with httpx.Client(base_url=url) as client:
        # The same signed body again is a replay, whatever delivery id it claims.
        again = {**delivered.headers, "X-Gitea-Delivery": "another-id"}
        replayed = client.post("/webhooks/gitea", content=delivered.body, headers=again)
        # A forged one: the body changed, the signature kept; or a guessed secret.
        payload = json.loads(delivered.body)
        payload["comment"]["body"] = "/phasegate cancel"
        forged_body = json.dumps(payload).encode()
        forged = client.post("/webhooks/gitea", content=forged_body, headers=delivered.headers)
        unsigned = {k: v for k, v in delivered.headers.items() if "Signature" not in k}
        bare = client.post("/webhooks/gitea", content=forged_body, headers=unsigned)
    assert replayed.status_code == 403 and "delivered before" in replayed.json()["detail"]
    assert (forged.status_code, bare.status_code) == (401, 401)
    time.sleep(0.3)
    row = store.workflow_row(workflow_id)
    assert (row["status"], row["dev_round"], row["version"]) == ("waiting", 2, version)


def test_a_trusted_label_delivered_by_gitea_starts_its_workflow_and_an_untrusted_one_not(
    gitea: GiteaLab, hooked: tuple[Engine, Store, Dashboard]
) -> None:
    engine, store, dashboard = hooked
    dashboard.worker = False
    url = dashboard.start()
    gitea.server.hooks.add(gitea.repository, f"{url}/webhooks/gitea", SECRET, ("issue_label",))
    number = gitea.open_issue("olga", "Add the feature", "Write feature.txt.")
    gitea.label("rex", number, "phasegate")  # read permission only
    [ignored] = gitea.server.hooks.wait_all()
    assert ignored.status == 202 and store.list_workflows() == []
    gitea.unlabel("maya", number, "phasegate")
    gitea.label("maya", number, "phasegate")
    assert {d.status for d in gitea.server.hooks.wait_all()} == {202}
    [row] = store.list_workflows()
    assert row["issue_number"] == number


def test_a_delivery_with_forgejos_own_headers_alone_is_taken(
    gitea: GiteaLab, hooked: tuple[Engine, Store, Dashboard]
) -> None:
    """Forgejo sends ``X-Forgejo-Event`` and ``X-Forgejo-Signature`` beside Gitea's
    headers today; a delivery with its own alone starts the workflow just the same."""
    engine, store, dashboard = hooked
    dashboard.worker = False
    url = dashboard.start()
    # Delivered nowhere: its body and headers are sent below as Forgejo's own.
    gitea.server.hooks.add(gitea.repository, "http://127.0.0.1:9/", SECRET, ("issue_label",))
    number = gitea.open_issue("olga", "Add the feature", "Write feature.txt.")
    gitea.label("maya", number, "phasegate")
    [delivered] = gitea.server.hooks.wait_all()
    forgejo = {
        k: v for k, v in delivered.headers.items() if not k.startswith(("X-Gitea-", "X-Gogs-"))
    }
    assert {"X-Forgejo-Event", "X-Forgejo-Signature"} <= set(forgejo)
    with httpx.Client(base_url=url) as client:
        taken = client.post("/webhooks/gitea", content=delivered.body, headers=forgejo)
    assert taken.status_code == 202, taken.text
    [row] = store.list_workflows()
    assert row["issue_number"] == number
