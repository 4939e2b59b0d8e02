"""The commands people use with a Gitea forge: ``phasegate watch`` starts a
workflow from a trusted label, ``/phasegate cancel`` in a trusted person's
comment cancels one (an outsider's does nothing), ``phasegate doctor`` asks
Gitea what the token may do, and ``--new-project`` refuses what it cannot make.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from phasegate.integrations.triggers import Commanded, Watcher
from phasegate.runtime.engine import Engine
from phasegate.store import Store

from conftest import make_repo, phasegate_cli, scripted_cartridge
from gitea_forge_kit import GiteaLab, gitea, team_repo

__all__ = ["gitea"]

Build = Callable[..., tuple[Engine, Store]]


def test_watch_once_starts_a_workflow_for_a_trusted_label_on_gitea(
    gitea: GiteaLab, tmp_path: Path
) -> None:
    repo, _ = team_repo(gitea, tmp_path, auto_merge=False)
    number = gitea.open_issue("olga", "Add the feature", "Write feature.txt.")
    gitea.label("maya", number, "phasegate")
    proc = phasegate_cli("watch", "-C", str(repo), "--once", "--json")
    assert proc.returncode == 0, proc.stderr
    [started] = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert (started["event"], started["issue"], started["labelled_by"]) == (
        "started",
        number,
        "maya",
    )


def test_a_trusted_cancel_comment_cancels_and_an_outsiders_does_nothing(
    gitea: GiteaLab, tmp_path: Path, engine_for: Build
) -> None:
    repo, prompts = team_repo(gitea, tmp_path, auto_merge=False)
    engine, store = engine_for(repo)
    watcher = Watcher(engine, gitea.repository, max_ticket_bytes=1_000_000)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row["error"]
    pr, issue = row["pr_number"], row["issue_number"]

    gitea.comment("rex", pr, "/phasegate cancel\nSENTINEL-outsider stop it")
    assert engine.advance(workflow_id)["dev_round"] == row["dev_round"]  # no feedback
    [refused] = [r for r in watcher.watch_once() if isinstance(r, Commanded)]
    assert (refused.command, refused.by) == ("cancel", "rex") and refused.refused
    assert store.workflow_row(workflow_id)["status"] == "waiting"

    gitea.comment("maya", issue, "/phasegate cancel")
    [done] = [r for r in watcher.watch_once() if isinstance(r, Commanded)]
    assert (done.command, done.by, done.refused) == ("cancel", "maya", None)
    row = store.workflow_row(workflow_id)
    assert (row["status"], row["error"]) == ("cancelled", "cancelled by maya")
    assert gitea.issue(pr).state == "closed" and gitea.issue(issue).state == "open"
    assert gitea.labels(issue) == {"phasegate:cancelled"}
    every = "".join(p.read_text() for p in prompts.iterdir())
    assert "SENTINEL-outsider" not in every and "/phasegate" not in every


def test_doctor_says_what_the_token_may_do_on_gitea(gitea: GiteaLab, tmp_path: Path) -> None:
    repo, _ = team_repo(gitea, tmp_path)

    def doctor(token: str, *extra: str) -> dict[str, object]:
        proc = phasegate_cli("doctor", "--repo", str(repo), "--json", *extra,
                             env={"GITEA_TOKEN": token})  # fmt: skip
        return json.loads(proc.stdout)  # type: ignore[no-any-return]

    found = doctor(gitea.bot_token)
    assert found["forge"]["access"] == "admin", found  # type: ignore[index]
    assert not [m for m in found["missing"] if str(m).startswith("forge")]  # type: ignore[attr-defined]
    found = doctor(gitea.token("maya"))
    [problem] = [m for m in found["missing"] if str(m).startswith("forge")]  # type: ignore[attr-defined]
    assert "not administer" in problem and "GITEA_TOKEN" in problem
    found = doctor("not-a-token-at-all")
    [problem] = [m for m in found["missing"] if str(m).startswith("forge")]  # type: ignore[attr-defined]
    assert "GITEA_TOKEN" in problem and "401" in problem and "not-a-token" not in problem
    said = phasegate_cli("doctor", "--repo", str(repo), env={"GITEA_TOKEN": gitea.bot_token})
    assert "forge: Gitea octo/widgets at " in said.stdout and "administers it" in said.stdout
    asked = len(gitea.server.requests)
    found = doctor(gitea.bot_token, "--offline")
    assert found["forge"]["access"] == "unknown" and len(gitea.server.requests) == asked  # type: ignore[index]


def test_new_project_on_gitea_is_refused_and_makes_nothing(gitea: GiteaLab, tmp_path: Path) -> None:
    where = make_repo(tmp_path / "template", {"README.md": "# t\n"})
    (where / "phasegate.toml").write_text(scripted_cartridge() + "\n" + gitea.cartridge())
    checkout = tmp_path / "gadgets"
    proc = phasegate_cli(
        "run", "--new-project", "gadgets", "--dir", str(checkout), "-C", str(where), "a ticket"
    )
    assert proc.returncode != 0 and "GitHub only" in " ".join((proc.stdout + proc.stderr).split())
    assert not checkout.exists() and gitea.server.requests == []
