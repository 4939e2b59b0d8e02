"""A limit that runs out passes on what it learned.

When PR review rounds, development retries or plan review rounds end at their
cap, the last round's findings reach the next build's prompt (after a person's
``resume`` or an automatic reversion), the report, and what ``show`` prints
(the workflow's reason and the decision record's). Real ``phasegate worker``
processes and the appending command agent of test_reentry.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from test_graph_workflow import ANSWERS, FEATURE, OTHER_FEATURE, graph_repo
from test_reentry import STOPPED, Lab

from phasegate.core import decisions
from phasegate.runtime.engine import Engine
from phasegate.store import Store

from conftest import phasegate_cli

FINDING = "FINDING-7f3a: the log line must name the ticket"
CHECK_FAILURE = "CHECK-FAILURE-91c2: the flag file is missing"


def _show(lab: Lab, workflow_id: str) -> str:
    shown = phasegate_cli("show", workflow_id, "--repo", str(lab.repo), timeout=60)
    assert shown.returncode == 0, shown.stderr
    return " ".join(shown.stdout.split())


def _resume(lab: Lab, workflow_id: str) -> None:
    resumed = phasegate_cli(
        "resume", workflow_id, "--no-advance", "--repo", str(lab.repo), timeout=60
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr


def _report_text(lab: Lab, workflow_id: str) -> str:
    from phasegate.forge import LocalForge
    from phasegate.git.workspace import Workspace

    store = lab.store()
    try:
        comments = LocalForge(store, lab.repo, Workspace()).comment_rows()
        return "\n".join(c["body"] for c in comments if ":report:" in str(c["marker"]))
    finally:
        store.close()


def test_review_rounds_running_out_carry_the_last_findings_to_the_next_build_and_the_report(
    tmp_path: Path,
) -> None:
    lab = Lab(tmp_path, extra="[limits]\nmax_pr_review_rounds = 1\n")
    try:
        lab.configure(
            answers={
                "review": [
                    f"{FINDING}\nVERDICT: request_changes",
                    "Now it names the ticket.\nVERDICT: approve",
                ]
            }
        )
        workflow_id = lab.start()
        row = lab.settle(workflow_id)
        assert (row["current_phase"], row["status"]) == ("pr_review", "paused"), lab.log_tail()
        assert FINDING in row["error"]
        assert FINDING in _show(lab, workflow_id)
        assert lab.calls("build") == 1

        _resume(lab, workflow_id)
        row = lab.settle(workflow_id)

        assert row["status"] == "completed", lab.log_tail()
        assert lab.calls("build") == 2 and lab.calls("review") == 2  # never the same diff twice
        assert FINDING in lab.prompt("build", 2)
        report = _report_text(lab, workflow_id)
        assert "Limits that ran out" in report and FINDING in report, report
        limits = row["state"]["report"]["limits"]
        assert [(x["phase"], x["loop"], x["rounds"]) for x in limits] == [
            ("pr_review", "PR review rounds", 1)
        ]
    finally:
        lab.cleanup()


def test_review_rounds_running_out_under_ci_put_the_findings_in_the_decision_record_and_rebuild(
    tmp_path: Path,
) -> None:
    lab = Lab(tmp_path, extra="[limits]\nmax_pr_review_rounds = 1\n", profile="ci")
    try:
        lab.configure(
            answers={
                "review": [
                    f"{FINDING}\nVERDICT: request_changes",
                    "Now it names the ticket.\nVERDICT: approve",
                ],
                # the re-plan plans anew: the same plan again would stop as no_progress
                "plan": ["1. Append a line to log.txt.", "1. Append a line naming the ticket."],
            }
        )
        workflow_id = lab.start()

        row = lab.settle(workflow_id, (*STOPPED, "waiting"))

        assert row["status"] in ("completed", "waiting"), lab.log_tail()
        (decision,) = row["state"]["decisions"]
        assert decision["source_phase"] == "pr_review" and FINDING in decision["reason"]
        assert FINDING in _show(lab, workflow_id)
        assert FINDING in lab.prompt("plan", 2)  # the re-plan
        assert FINDING in lab.prompt("build", 2)  # and the build after it
    finally:
        lab.cleanup()


def test_development_retries_running_out_carry_the_check_failure_to_resume_and_the_report(
    tmp_path: Path,
) -> None:
    flag = tmp_path / "flag"
    lab = Lab(
        tmp_path,
        extra="[limits]\nmax_dev_retries = 0\n",
        checks=[f"test -f {flag} || {{ echo '{CHECK_FAILURE}'; exit 1; }}"],
    )
    try:
        workflow_id = lab.start()
        row = lab.settle(workflow_id)
        assert (row["current_phase"], row["status"]) == ("development", "paused"), lab.log_tail()
        assert CHECK_FAILURE in row["error"] and CHECK_FAILURE in _show(lab, workflow_id)

        flag.write_text("")
        _resume(lab, workflow_id)
        row = lab.settle(workflow_id)

        assert row["status"] == "completed", lab.log_tail()
        assert CHECK_FAILURE in lab.prompt("build", 2)
        assert "development retries ran out" in lab.prompt("build", 2)
        report = _report_text(lab, workflow_id)
        assert CHECK_FAILURE in report, report
    finally:
        lab.cleanup()


def test_plan_rounds_running_out_carry_the_plan_reviewers_comments_to_the_build(
    tmp_path: Path,
) -> None:
    lab = Lab(tmp_path, extra="[limits]\nmax_plan_rounds = 1\n")
    try:
        lab.configure(answers={"plan_review": [f"{FINDING}\nVERDICT: revise"]})
        workflow_id = lab.start()

        row = lab.settle(workflow_id)

        assert row["status"] == "completed", lab.log_tail()
        assert FINDING in lab.prompt("build", 1)
        assert "plan review rounds ran out" in lab.prompt("build", 1)
        assert FINDING in _report_text(lab, workflow_id)
    finally:
        lab.cleanup()


def test_the_graph_fix_loop_running_out_tells_the_next_run_what_it_found(
    tmp_path: Path, engine_for: Callable[..., tuple[Engine, Store]]
) -> None:
    answers = (
        ANSWERS.replace(
            'text = "Correct.\\nVERDICT: approve"',
            f'text = "{FINDING}\\nVERDICT: request_changes"',
        )
        + f"[[build]]\ntext = '''{FEATURE}'''\n"
        + f"[[build]]\ntext = '''{OTHER_FEATURE}'''\n"
    )
    repo = graph_repo(tmp_path, answers=answers, profile="manual")
    engine, store = engine_for(repo)
    workflow_id = engine.start("Add feature.txt", "feature.txt holds 'the feature'")
    row = engine.advance(workflow_id)
    assert (row["current_phase"], row["status"]) == ("development", "paused")
    assert FINDING in row["error"]
    (limit,) = [m for m in store.milestones(workflow_id) if m.kind == "limit_reached"]
    assert limit.data["loop"] == "graph fix loop" and FINDING in limit.data["findings"]

    engine.decide(workflow_id, decisions.resume)
    engine.advance(workflow_id)

    ticket = store.workflow_row(workflow_id)["state"]["graph_ticket"]
    assert "## The previous change was rejected\n\nthe fix loop stopped" in ticket
    assert FINDING in ticket
    assert store.workflow_row(workflow_id)["state"]["graph_runs"] == 2
