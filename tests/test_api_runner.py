"""The ``api`` runner through real litellm, against the scripted model server's
OpenAI chat-completions endpoint: answers, diffs applied in real git
repositories, the error kinds, and a whole workflow through the real CLI."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from phasegate.agents.base import AgentRequest
from phasegate.agents.runners.api import ApiRunner, extract_diff
from phasegate.config.cartridge import RoleBinding
from phasegate.testing.model_server import ScriptedModelServer, Step, key_sha

from conftest import ROLES, git, make_repo, phasegate_cli, scripted_cartridge

KEY_ENV = "PHASEGATE_TEST_MODEL_KEY"
SENTINEL = "sk-sentinel-api-7d21c9e04b6a58f3"
MODEL = "openai/scripted-model"

PLAN = "You are planning a change"
PLAN_REVIEW = "Review this implementation plan"
BUILD = "Implement the plan below"
REVIEW = "Review this pull request"
VERIFY = "You are an independent verifier"

APP = "def greet():\n    return 'hello'\n\n\ndef main():\n    print(greet())\n"
APP_PATCH = """--- a/src/app.py
+++ b/src/app.py
@@ -1,5 +1,5 @@
 def greet():
-    return 'hello'
+    return 'hello, world'


 def main():
"""  # blank context lines without their space, as models write them
APP_DIFF = f"Greet the world instead.\n\n```diff\n{APP_PATCH}```\n"


@pytest.fixture(autouse=True)
def _model_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, SENTINEL)
    monkeypatch.setenv("OPENAI_API_KEY", "not-the-key-litellm-should-use")


def runner(server: ScriptedModelServer, **binding: object) -> ApiRunner:
    fields: dict[str, object] = {
        "runner": "api",
        "model": MODEL,
        "base_url": server.url + "/v1",
        "api_key_env": KEY_ENV,
        **binding,
    }
    return ApiRunner(RoleBinding(**fields))


def request(
    cwd: Path,
    prompt: str,
    *,
    read_only: bool = False,
    timeout_s: float = 20,
    budget_usd: float | None = None,
) -> AgentRequest:
    return AgentRequest(
        workflow_id="wf",
        phase="planning" if read_only else "development",
        role="plan" if read_only else "build",
        session_line="main",
        prompt=prompt,
        cwd=cwd,
        timeout_s=timeout_s,
        read_only=read_only,
        budget_usd=budget_usd,
    )


def app_repo(tmp_path: Path) -> Path:
    return make_repo(tmp_path / "repo", {"README.md": "# app\n", "src/app.py": APP})


def user_message(server: ScriptedModelServer) -> str:
    (message,) = [m for m in server.requests[-1].body["messages"] if m["role"] == "user"]
    return message["content"]


def test_a_text_answer_carries_its_usage_and_the_binding_s_price(
    tmp_path: Path, server_factory
) -> None:
    server = server_factory({"*": [Step(text="1. Do it.", input_tokens=1000, output_tokens=200)]})
    api = runner(server, input_usd_per_mtok=2.0, output_usd_per_mtok=8.0, max_tokens=512)
    result = api.run(request(tmp_path, "Plan the change", read_only=True), threading.Event())

    assert result.ok, result.error
    assert result.text == "1. Do it."
    assert (result.input_tokens, result.output_tokens) == (1000, 200)
    assert result.cost_usd == pytest.approx((1000 * 2.0 + 200 * 8.0) / 1e6)
    assert result.session_id is None and result.duration_s > 0
    (sent,) = server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.key_sha == key_sha(SENTINEL)
    assert sent.body["model"] == "scripted-model" and sent.body["max_tokens"] == 512
    assert [m["role"] for m in sent.body["messages"]] == ["system", "user"]
    assert user_message(server) == "Plan the change"  # read-only roles see only the prompt


def test_without_binding_prices_the_cost_is_litellm_s_or_zero(
    tmp_path: Path, server_factory
) -> None:
    import litellm

    server = server_factory({"*": [Step(text="ok", input_tokens=1000, output_tokens=100)]})
    known = runner(server, model="openai/gpt-4o-mini").run(
        request(tmp_path, "q", read_only=True), threading.Event()
    )
    prices = litellm.model_cost["gpt-4o-mini"]
    expected = 1000 * prices["input_cost_per_token"] + 100 * prices["output_cost_per_token"]
    assert known.ok and known.cost_usd == pytest.approx(expected) and expected > 0

    unknown = runner(server).run(request(tmp_path, "q", read_only=True), threading.Event())
    assert unknown.ok and unknown.cost_usd == 0.0 and unknown.input_tokens == 1000


NOTES_PATCH = "--- /dev/null\n+++ b/NOTES.md\n@@ -0,0 +1 @@\n+greets the world"
GIT_STYLE = (
    "diff --git a/src/app.py b/src/app.py\nindex 0123abc..4567def 100644\n"
    + APP_PATCH
    + "diff --git a/NOTES.md b/NOTES.md\n"  # no `new file mode`: git alone would write dev/null
    + NOTES_PATCH
    + "\n"
)
ANSWERS = {
    "fenced": f"Greet the world.\n\n```diff\n{APP_PATCH}{NOTES_PATCH}\n```\n",
    "bare-without-final-newline": APP_PATCH + NOTES_PATCH,
    "git-headers": f"```diff\n{GIT_STYLE}```",
    "no-a-b-prefixes": "```patch\n"
    + (APP_PATCH + NOTES_PATCH).replace("a/src", "src").replace("b/", "")
    + "\n```",
}


@pytest.mark.parametrize("case", sorted(ANSWERS))
def test_the_build_role_s_diff_is_applied_in_the_repository(
    tmp_path: Path, server_factory, case: str
) -> None:
    answer = ANSWERS[case]
    repo = app_repo(tmp_path)
    server = server_factory({BUILD: [Step(text=answer)]})
    prompt = f"{BUILD}\n\n## Plan\n\n1. In `src/app.py`, greet the world; add NOTES.md."
    result = runner(server).run(request(repo, prompt), threading.Event())

    assert result.ok, result.error
    assert "applied the diff to 2 file(s): NOTES.md, src/app.py" in result.text
    assert (repo / "src/app.py").read_text() == APP.replace("'hello'", "'hello, world'")
    assert (repo / "NOTES.md").read_text() == "greets the world\n"
    assert git(repo, "status", "--porcelain").splitlines() == ["M src/app.py", "?? NOTES.md"]
    # the model was shown the tracked files and the content of the one the prompt names
    shown = user_message(server)
    assert "README.md\nsrc/app.py" in shown
    assert "### src/app.py" in shown and "    return 'hello'" in shown
    assert "### README.md" not in shown
    assert server.requests[0].body["messages"][0]["content"].count("unified diff") >= 1


def test_a_diff_reaching_outside_the_worktree_changes_nothing(
    tmp_path: Path, server_factory
) -> None:
    repo = app_repo(tmp_path)
    escape = "```diff\n--- /dev/null\n+++ b/../x\n@@ -0,0 +1 @@\n+owned\n```\n"
    server = server_factory({"*": [Step(text=escape, input_tokens=50, output_tokens=10)]})
    result = runner(server).run(request(repo, "Implement it"), threading.Event())

    assert result.error_kind == "invalid_patch"
    assert "outside its worktree: ../x" in (result.error or "")
    assert (result.input_tokens, result.output_tokens) == (50, 10)  # the call was still paid
    assert not (tmp_path / "x").exists()
    assert git(repo, "status", "--porcelain") == ""


def test_an_answer_without_a_diff_or_with_one_that_does_not_apply_is_invalid_patch(
    tmp_path: Path, server_factory
) -> None:
    repo = app_repo(tmp_path)
    stale = APP_DIFF.replace("-    return 'hello'", "-    return 'howdy'")
    server = server_factory({"prose": [Step(text="I changed it.")], "stale": [Step(text=stale)]})
    prose = runner(server).run(request(repo, "prose"), threading.Event())
    assert (prose.error_kind, prose.error) == ("invalid_patch", "the answer holds no diff")
    bad = runner(server).run(request(repo, "stale"), threading.Event())
    assert bad.error_kind == "invalid_patch" and "does not apply" in (bad.error or "")
    assert git(repo, "status", "--porcelain") == ""


def test_an_http_500_is_a_model_error_with_its_status_and_no_retry(
    tmp_path: Path, server_factory
) -> None:
    server = server_factory({"*": [Step(status=500)]})
    result = runner(server).run(request(tmp_path, "q", read_only=True), threading.Event())
    assert result.error_kind == "model_error"
    assert (result.error or "").startswith("model API error 500")
    assert SENTINEL not in (result.error or "")
    assert len(server.requests) == 1  # retries are AgentService's, within agent_retries


def test_no_server_at_the_base_url_is_a_model_error_without_a_made_up_status(
    tmp_path: Path,
) -> None:
    # A port bound but not listening: connecting to it is refused at once. litellm
    # calls that InternalServerError with status 500; no server said anything.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
        api = ApiRunner(RoleBinding(runner="api", model=MODEL, base_url=url, api_key_env=KEY_ENV))
        result = api.run(request(tmp_path, "q", read_only=True), threading.Event())
    assert result.error_kind == "model_error"
    assert (result.error or "").startswith(f"model call failed (no connection to {url}): ")
    assert "Connection refused" in (result.error or "") and "500" not in (result.error or "")
    assert SENTINEL not in (result.error or "")


def test_a_hanging_model_is_a_timeout_within_the_bound(tmp_path: Path, server_factory) -> None:
    server = server_factory({"*": [Step(hang=True)]})
    started = time.monotonic()
    result = runner(server).run(
        request(tmp_path, "q", read_only=True, timeout_s=1.5), threading.Event()
    )
    elapsed = time.monotonic() - started
    assert result.error_kind == "timeout" and "1.5s" in (result.error or "")
    assert 1.4 < elapsed < 10  # the bound, not the hang (a loaded CI machine is slow)


EXIT_AFTER_A_TIMEOUT = """
import atexit, sys, threading
from pathlib import Path

def report():  # registered first, so it runs after the api runner's own handler
    from phasegate.agents.runners import api
    print("running at exit:", len(api._Call.running), flush=True)

atexit.register(report)

from phasegate.agents.runners.api import ApiRunner
from phasegate.agents.base import AgentRequest
from phasegate.config.cartridge import RoleBinding

binding = RoleBinding(runner="api", model="openai/m", base_url=sys.argv[1], api_key_env="K")
request = AgentRequest(
    workflow_id="wf", phase="planning", role="plan", session_line="main", prompt="q",
    cwd=Path("."), timeout_s=0.01, read_only=True,
)
print(ApiRunner(binding).run(request, threading.Event()).error_kind, flush=True)
"""


def test_a_process_exits_only_once_a_call_abandoned_at_its_timeout_ended(
    tmp_path: Path, server_factory
) -> None:
    # A fresh interpreter: the first call's thread is still in litellm's lazy
    # imports when the call times out and the process exits. Frozen there by the
    # interpreter's finalization, it once held an import lock that litellm's
    # finalizers waited for: `phasegate run` never ended. Now exit waits for it.
    server = server_factory({"*": [Step(hang=True)]})
    env = {**os.environ, "K": SENTINEL}
    done = subprocess.run(
        [sys.executable, "-c", EXIT_AFTER_A_TIMEOUT, server.url + "/v1"],
        capture_output=True,
        text=True,
        # What it guards against never ended; a fresh interpreter importing litellm
        # on a loaded machine has taken over 60 s.
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert (done.returncode, done.stdout) == (0, "timeout\nrunning at exit: 0\n"), done.stderr


def test_shutdown_interrupts_a_call_in_flight_promptly(tmp_path: Path, server_factory) -> None:
    server = server_factory({"*": [Step(hang=True)]})
    cancel = threading.Event()
    threading.Timer(0.5, cancel.set).start()
    started = time.monotonic()
    result = runner(server).run(request(tmp_path, "q", read_only=True), cancel)
    assert result.error_kind == "interrupted"
    assert time.monotonic() - started < 10  # not the 20 s timeout: the hang was cut short


def test_a_call_over_its_budget_keeps_its_text_and_applies_nothing(
    tmp_path: Path, server_factory
) -> None:
    repo = app_repo(tmp_path)
    server = server_factory({"*": [Step(text=APP_DIFF, input_tokens=1_000_000)]})
    api = runner(server, input_usd_per_mtok=3.0, output_usd_per_mtok=15.0)
    result = api.run(request(repo, "Implement it", budget_usd=1.0), threading.Event())
    assert result.error_kind == "budget" and result.text == APP_DIFF
    assert result.cost_usd == pytest.approx(3.0 + 20 * 15.0 / 1e6)
    assert git(repo, "status", "--porcelain") == ""


def test_without_litellm_or_the_key_variable_the_runner_says_what_is_missing(
    tmp_path: Path, server_factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = server_factory({"*": [Step(text="unused")]})
    monkeypatch.delenv(KEY_ENV)
    unset = runner(server).run(request(tmp_path, "q", read_only=True), threading.Event())
    assert unset.error_kind == "runner_error" and KEY_ENV in (unset.error or "")

    monkeypatch.setitem(sys.modules, "litellm", None)  # `import litellm` now fails
    missing = runner(server).run(request(tmp_path, "q", read_only=True), threading.Event())
    assert missing.error_kind == "runner_error"
    assert "pip install 'phasegate[api]'" in (missing.error or "")
    assert server.requests == []


def test_extract_diff_finds_the_diff_in_an_answer() -> None:
    diff = "--- a/f\n+++ b/f\n@@ -1 +1 @@\n-a\n+b\n"
    assert extract_diff(f"Here:\n```diff\n{diff}```\nDone.") == diff
    assert extract_diff(f"```\n{diff}```") == diff  # an unlabelled block holding a diff
    assert extract_diff(diff) == diff  # a bare diff
    fenced_md = "--- a/R.md\n+++ b/R.md\n@@ -1,3 +1,3 @@\n ```\n-x\n+y\n ```\n"
    assert extract_diff(f"```diff\n{fenced_md}```\n") == fenced_md  # fences inside the diff
    assert extract_diff(f"```diff\n{diff}") == diff  # cut off before its closing fence
    assert extract_diff("```python\nprint(1)\n```") is None


# -- a whole workflow through the real CLI ----------------------------------------------


def api_role(url: str) -> str:
    return "\n".join(
        [
            'runner = "api"',
            f'model = "{MODEL}"',
            f"base_url = {json.dumps(url + '/v1')}",
            f'api_key_env = "{KEY_ENV}"',
            "input_usd_per_mtok = 2.0",
            "output_usd_per_mtok = 8.0",
            "timeout = 60",
            "",
        ]
    )


BUILD_ANSWER = """Adds feature.txt and mentions it in the README.

```diff
--- a/README.md
+++ b/README.md
@@ -1 +1,3 @@
 # r
+
+See feature.txt.
--- /dev/null
+++ b/feature.txt
@@ -0,0 +1 @@
+the feature
```"""


@pytest.mark.slow
def test_a_whole_workflow_with_every_role_on_the_api_runner(tmp_path: Path, server_factory) -> None:
    server = server_factory(
        {
            PLAN: [Step(text="1. Create feature.txt; mention it in README.md.")],
            PLAN_REVIEW: [Step(text="Sound.\nVERDICT: approve")],
            BUILD: [Step(text=BUILD_ANSWER, input_tokens=300, output_tokens=60)],
            REVIEW: [Step(text="Minimal and correct.\nVERDICT: approve")],
            VERIFY: [Step(text="The checks pass.\nVERDICT: confirmed")],
        }
    )
    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n", ".gitignore": ".phasegate/\n"})
    roles = {role: api_role(server.url) for role in ROLES}
    (repo / "phasegate.toml").write_text(
        scripted_cartridge(checks=["test -f feature.txt"], role_overrides=roles)
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "cartridge")
    env = {KEY_ENV: SENTINEL, "OPENAI_API_KEY": "not-the-key-litellm-should-use"}

    proc = phasegate_cli(
        "run", "--repo", str(repo), "--json", "Add feature.txt", env=env, timeout=240
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["status"] == "completed", summary
    assert git(repo, "show", "main:feature.txt") == "the feature"
    assert git(repo, "show", "main:README.md") == "# r\n\nSee feature.txt."

    shown = phasegate_cli("show", summary["id"], "--repo", str(repo), "--json")
    runs = json.loads(shown.stdout)["agent_runs"]
    assert [(r["role"], r["runner"], r["outcome"]) for r in runs] == [
        (role, "api", "ok") for role in ROLES
    ]
    # the build saw README.md's content (the plan names it); everyone sent the named key
    (build,) = server.played(BUILD)
    assert "### README.md" in build.body["messages"][1]["content"]
    assert [r.script for r in server.requests] == [PLAN, PLAN_REVIEW, BUILD, REVIEW, VERIFY]
    assert {r.key_sha for r in server.requests} == {key_sha(SENTINEL)}

    # five calls: four of 100 + 20 tokens and the build's 300 + 60, priced by the binding
    assert summary["tokens"] == 4 * 120 + 360
    expected_cost = (4 * (100 * 2.0 + 20 * 8.0) + (300 * 2.0 + 60 * 8.0)) / 1e6
    assert summary["cost_usd"] == pytest.approx(expected_cost, rel=1e-6)
    status = phasegate_cli("status", "--repo", str(repo), "--json")
    (row,) = json.loads(status.stdout)
    assert row["tokens"] == summary["tokens"]
    assert row["cost_usd"] == pytest.approx(expected_cost, rel=1e-6)

    for text in (proc.stdout, proc.stderr, shown.stdout, shown.stderr, status.stdout):
        assert SENTINEL not in text
    db = repo / ".phasegate" / "state.db"
    assert SENTINEL.encode() not in db.read_bytes()
    with sqlite3.connect(db) as conn:
        assert SENTINEL not in "\n".join(conn.iterdump())
