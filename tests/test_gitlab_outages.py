"""Conflicts and faults in whole workflows on GitLab: a base that moved into a
conflict forks its resolution, and 500s, a 429 and a create that timed out
leave exactly one issue, merge request, note and merge. The fake GitLab, real
git over HTTP, every request judged by python-gitlab's managers."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from phasegate.core import decisions
from phasegate.runtime.engine import Engine
from phasegate.store import Store

from conftest import git
from gitlab_forge_kit import BOT, TEAM, gitlab, team_project
from support.conflict_build import alpha_and_beta, merged_through_child
from support.gitlab_lab import Lab

__all__ = ["gitlab"]  # a fixture, used by name

Build = Callable[..., tuple[Engine, Store]]

# The build agent: in a conflict child's checkout (markers in feature.txt) it
# resolves them to both lines; in development it writes the line its ticket names.
BUILD = """prompt=$(cat)
if grep -q '^<<<<<<< ' feature.txt; then
  printf 'alpha\\nbeta\\n' > feature.txt
  echo resolved
  exit 0
fi
case "$prompt" in
  *"says alpha"*) echo alpha > feature.txt ;;
  *"says beta"*) echo beta > feature.txt ;;
esac
echo built
"""


def test_a_conflict_with_gitlabs_main_forks_a_child_whose_resolution_gitlab_merges(
    gitlab: Lab, tmp_path: Path, engine_for: Build
) -> None:
    script = tmp_path / "build.sh"
    script.write_text(BUILD)
    build = f'runner = "command"\ncommand = "sh {script}"\n'
    repo, _ = team_project(
        gitlab, tmp_path, {"build": build}, auto_merge=False, files={"feature.txt": "original\n"}
    )
    engine, store = engine_for(repo)
    project = gitlab.gl.project(TEAM)
    stale = git(repo, "rev-parse", "main")
    a, b = alpha_and_beta(engine)
    engine.decide(a, lambda ctx: decisions.approve_merge(ctx, "test"))
    assert engine.advance(a)["status"] == "completed"
    merged_a = project.bare.branch_sha("main")

    row, child = merged_through_child(engine, store, b)
    resolution = child["state"]["resolution"]
    mr = project.merge_requests[row["pr_number"] - 1_000_000]
    assert mr.state == "merged" and mr.merged_sha == resolution
    assert project.bare.git("show", "main:feature.txt") == "alpha\nbeta\n"
    assert project.bare.branch_sha("main") == row["merge_sha"]
    assert git(repo, "merge-base", "--is-ancestor", merged_a, resolution) == ""
    assert git(repo, "rev-parse", "main") == stale  # the local main never moved
    assert len(project.merge_requests) == 2


def test_500s_a_429_and_a_timed_out_create_leave_one_of_everything(
    gitlab: Lab, tmp_path: Path, engine_for: Build
) -> None:
    repo, _ = team_project(gitlab, tmp_path, auto_merge=False, forge_extra="timeout_s = 1\n")
    gl = gitlab.gl
    project = gl.project(TEAM)
    gl.fail("POST", r"/issues$", 500, times=1)  # looked up, then made once
    gl.fail("POST", r"/merge_requests$", 429, times=1, headers={"Retry-After": "1"})
    gl.delay("POST", r"/issues/1/notes$", 1.5)  # the plan: GitLab makes it after our timeout
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add the feature", "Write feature.txt")
    row = engine.advance(workflow_id)
    assert row["status"] == "paused" and row["error"].startswith("forge_unavailable:"), row
    assert "in time" in row["error"]  # the plan's note: GitLab is still making it
    time.sleep(2.0)  # the journal looks after twice forge.timeout_s

    engine.decide(workflow_id, decisions.resume)
    gl.fail("GET", r"/pipelines$", 500, times=4)  # more than forge.max_retries (3)
    row = engine.advance(workflow_id)
    assert row["status"] == "paused" and row["error"].startswith("forge_unavailable:"), row
    engine.decide(workflow_id, decisions.resume)
    row = engine.advance(workflow_id)
    assert row["status"] == "waiting", row["error"]
    issue = project.issues[1]
    assert len(project.issues) == 1 and len(project.merge_requests) == 1
    plans = [n for n in issue.notes if n.author.username == BOT and "Progress" not in n.body]
    assert len(plans) == 1, [n.body[:60] for n in issue.notes]
    statuses = [r.status for r in gl.requests if r.method == "POST" and r.path.endswith("/issues")]
    assert statuses == [500, 201]
    made = [r.status for r in gl.requests if r.method == "POST" and r.path.endswith("_requests")]
    assert made == [429, 201]

    gl.fail("PUT", r"/merge$", 502, times=2)
    engine.decide(workflow_id, lambda ctx: decisions.approve_merge(ctx, "test"))
    row = engine.advance(workflow_id)
    assert row["status"] == "completed", row["error"]
    merges = [r.status for r in gl.requests if r.method == "PUT" and r.path.endswith("/merge")]
    assert merges == [502, 502, 200]
    assert project.merge_requests[1].state == "merged" and issue.state == "closed"
