"""A workflow built by a worker on one machine, seen from a third clone: the
dashboard served there shows the machine running it and its diff, fetched from
the forge (never into the clone's own branches), and once merged `phasegate
diff` there prints the merge's change.

Real parts: the fake GitHub behind Prism and real git clones of its repository,
a real PostgreSQL store shared by every clone, a real ``phasegate worker``
process (its machine played by ``PHASEGATE_HOSTNAME``), the dashboard through
TestClient.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fastapi.testclient import TestClient

from phasegate.config.cartridge import load_cartridge
from phasegate.runtime.engine import Engine
from phasegate.store import open_store
from phasegate.web import Access, create_app

from conftest import (
    ANSWERS_BUT_BUILD,
    GitHubLab,
    git,
    github_repo,
    phasegate_cli,
    recording_build,
    scripted_cartridge,
)

PHASEGATE = Path(sys.executable).parent / "phasegate"
WAIT_S = 600.0  # bound on a wait: a failure message, never a speed judgement
TOKEN = "web-token-for-shared-diffs-0123456789"


def _clone(lab: GitHubLab, path: Path) -> Path:
    url = f"{lab.server.url}/git/{lab.repository}.git"
    header = f"http.extraHeader=Authorization: token {lab.bot.token}"
    subprocess.run(["git", "-c", header, "clone", "-q", url, str(path)], check=True)
    return path.resolve()


def _until(what: str, done: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{what}: worker exit {proc.poll()}\n{log.read_text()[-4000:]}")
        time.sleep(0.2)


def test_a_workflow_built_on_machine_a_shows_its_machine_and_diff_on_a_third_clone(
    github: GitHubLab, pg_url: str, tmp_path: Path
) -> None:
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    started, release = tmp_path / "review-started", tmp_path / "review-release"
    # The reviewer holds the workflow (and machine A its lease) until the test lets go.
    review = (
        'runner = "command"\n'
        f"command = '''touch {started}; while [ ! -e {release} ]; do sleep 0.2; done; "
        "echo \"VERDICT: approve\"'''\n"
    )
    text = scripted_cartridge(
        role_overrides={"build": recording_build(prompts), "review": review},
        auto_merge=True,
        extra=f'[store]\nurl = "{pg_url}"\n',
    )
    files = {"README.md": "# widgets\n", ".gitignore": ".phasegate/\n"}
    github_repo(github, tmp_path / "seed", text, {**files, "answers.toml": ANSWERS_BUT_BUILD})
    clone_a = _clone(github, tmp_path / "machine-a" / "widgets")
    clone_c = _clone(github, tmp_path / "machine-c" / "widgets")
    store = open_store(pg_url)
    log = tmp_path / "worker-a.log"
    worker: subprocess.Popen[bytes] | None = None
    try:
        workflow_id = Engine(clone_a, load_cartridge(clone_a), store).start(
            "Add the feature", "Write feature.txt"
        )
        with log.open("wb") as out:
            worker = subprocess.Popen(
                [str(PHASEGATE), "worker", "--repo", str(clone_a), "--concurrency", "1"]
                + ["--poll", "0.5"],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "PHASEGATE_HOSTNAME": "machine-a", "COLUMNS": "200"},
            )
        _until("machine A's reviewer starts", started.exists, worker, log)
        row = store.workflow_row(workflow_id)
        branch = row["branch_name"]
        assert row["lease_owner"].startswith("machine-a:") and row["repo_path"] == str(clone_a)
        assert git(clone_c, "branch", "--list", branch) == ""  # C never built it

        dashboard = Engine(clone_c, load_cartridge(clone_c), store)
        with TestClient(create_app(dashboard, Access(token=TOKEN, user="carol"))) as client:
            client.get(f"/login?token={TOKEN}")
            board = client.get("/").text
            assert '<dd class="wf-machine" title="worker machine-a:' in board
            assert '">machine-a</dd>' in board
            page = client.get(f"/workflows/{workflow_id}").text
            assert 'id="wf-machine" title="worker machine-a:' in page
            assert '">machine-a</dd>' in page
            diff = client.get(f"/workflows/{workflow_id}/diff").text
        assert 'id="diff-missing"' not in diff
        assert f"branch {branch} against main (fetched from the forge)" in diff
        assert '<tr class="diff-file-row" data-path="feature.txt" data-status="added">' in diff
        assert '<tr class="diff-line diff-add" data-path="feature.txt" data-new="1">' in diff
        # Fetched into phasegate's own refs: C's branches and remotes did not move.
        assert git(clone_c, "branch", "--list", branch) == ""
        assert git(clone_c, "for-each-ref", f"refs/remotes/origin/{branch}") == ""
        assert git(clone_c, "rev-parse", f"refs/phasegate/forge/{branch}")

        release.touch()
        _until(
            "machine A merges it",
            lambda: store.workflow_row(workflow_id)["status"] in ("completed", "failed"),
            worker,
            log,
        )
        row = store.workflow_row(workflow_id)
        assert row["status"] == "completed", row["error"]
        merged = row["merge_sha"]
        assert merged
        shown = phasegate_cli("diff", workflow_id, "--repo", str(clone_c))
        assert shown.returncode == 0, shown.stderr
        assert "+++ b/feature.txt" in shown.stdout and "\n+feature " in shown.stdout
        assert f"merge commit {merged[:12]}" in shown.stderr
        assert git(clone_c, "branch", "--list", branch) == ""
    finally:
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, signal.SIGTERM)
            worker.wait(timeout=60)
        store.close()
