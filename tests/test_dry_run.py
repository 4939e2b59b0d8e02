"""``phasegate dry-run``: the cartridge's whole workflow, offline, on a throwaway clone.

The real agent CLIs (as tests/test_real_agents.py finds them) run against the
scripted model server; the user's repository must come out exactly as it went
in: same refs, same working tree, same files under .git, no .phasegate.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from phasegate.config.cartridge import GRAPH_OPTIONAL_ROLES, RoleBinding
from phasegate.graph import prompts as graph_prompts
from phasegate.graph.facts import change_facts, extract_patch
from phasegate.graph.parse import REVIEW_VERDICTS, field, items, verdict
from phasegate.phases import acceptance_verification, development, planning, pr_review
from phasegate.tools.dryrun import (
    DRY_RUN_FILE,
    DUMMY_KEY,
    GRAPH_ROLE_MARKERS,
    ROLE_MARKERS,
    ScriptError,
    default_scripts,
    load_script,
    offline_binding,
)

from conftest import HAPPY_ANSWERS, ROLES, agent_cli, git, make_repo

SENTINEL = "sk-dry-run-sentinel-5b8c1e"


def dry_run(repo: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 240):
    """The real console script, with no model key in its environment."""
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "PHASEGATE_DRY_RUN_API_KEY")
    }
    exe = Path(sys.executable).parent / "phasegate"
    return subprocess.run(
        [str(exe), "dry-run", "--repo", str(repo), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**base, "COLUMNS": "200", **(env or {})},
    )


def make_user_repo(tmp_path: Path, roles: dict[str, str], *, extra: str = "") -> Path:
    """A repository with history and a second branch; its cartridge is not committed
    (as right after `phasegate init`)."""
    repo = make_repo(tmp_path / "user-repo", {"README.md": "# app\n", "app.py": "print(1)\n"})
    git(repo, "checkout", "-q", "-b", "topic")
    (repo / "notes.txt").write_text("topic work\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "topic")
    git(repo, "checkout", "-q", "main")
    cartridge = [
        '[workflow]\nbase_branch = "main"\nauto_merge = false\n',
        f'[landing_areas]\nchecks = ["test -f {DRY_RUN_FILE}"]\ncheck_timeout = 60\n',
        extra,
        *(f"[roles.{role}]\n{roles[role]}" for role in ROLES),
    ]
    (repo / "phasegate.toml").write_text("\n".join(cartridge))
    return repo


def snapshot(repo: Path) -> dict[str, object]:
    """Everything a dry run must leave alone."""
    files = {  # the index is left out: `git status` itself may refresh its stat data
        str(p.relative_to(repo)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted((repo / ".git").rglob("*"))
        if p.is_file() and p.name != "index"
    }
    return {
        "refs": git(repo, "for-each-ref", "--format=%(refname) %(objectname)"),
        "head": git(repo, "symbolic-ref", "HEAD"),
        "index": git(repo, "ls-files", "--stage"),
        "status": git(repo, "status", "--porcelain", "--ignored"),
        "worktrees": git(repo, "worktree", "list", "--porcelain"),
        "stash": git(repo, "stash", "list"),
        "tree": sorted(str(p.relative_to(repo)) for p in repo.rglob("*") if ".git" not in p.parts),
        "git_files": files,
    }


def claude_role(exe: str) -> str:
    # As a person would bind it: the real key's variable (unset here), the CLI's own tools.
    return (
        'runner = "claude-code"\n'
        f"executable = {json.dumps(exe)}\n"
        'api_key_env = "ANTHROPIC_API_KEY"\n'
        "max_turns = 8\n"
        "timeout = 90\n"
    )


@pytest.fixture
def claude() -> str:
    return agent_cli("claude")


@pytest.mark.slow
def test_a_dry_run_on_claude_code_completes_and_leaves_the_repository_untouched(
    tmp_path: Path, claude: str
) -> None:
    repo = make_user_repo(tmp_path, {role: claude_role(claude) for role in ROLES})
    before = snapshot(repo)

    proc = dry_run(repo, "--json", "Add the dry-run file")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    summary = result["workflow"]
    assert (summary["current_phase"], summary["status"]) == ("completed", "completed")
    assert summary["verification_status"] == "confirmed"
    assert summary["merge_sha"]  # merged, in the clone
    runs = result["agent_runs"]
    assert [(r["role"], r["runner"], r["outcome"]) for r in runs] == [
        (role, "claude-code", "ok") for role in ROLES
    ]
    assert all(r["session_id"] for r in runs)
    checks = [m for m in result["milestones"] if m["kind"] == "tests_run"]
    assert [m["status"] for m in checks] == ["completed"]  # the CLI's Write made the file
    info = result["dry_run"]
    assert info["offline_roles"] == list(ROLES) and info["as_is_roles"] == []
    assert info["model_requests"] == 6  # one per role, two for the build (tool, then text)
    assert info["repo"] == str(repo)
    assert not Path(info["clone"]).exists()  # removed afterwards

    assert snapshot(repo) == before
    assert not (repo / ".phasegate").exists()
    assert "phasegate/" not in git(repo, "branch", "--list", "-a")
    assert DUMMY_KEY not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_dry_run_whose_reviewer_always_requests_changes_ends_paused_with_the_reason(
    tmp_path: Path, claude: str
) -> None:
    repo = make_user_repo(
        tmp_path,
        {role: claude_role(claude) for role in ROLES},
        extra="[limits]\nmax_pr_review_rounds = 2\n",
    )
    script = tmp_path / "picky.toml"
    script.write_text(
        '[review]\nsteps = [{ text = "Not good enough.\\nVERDICT: request_changes" }]\n'
    )
    before = snapshot(repo)

    proc = dry_run(repo, "--script", str(script), "Add the dry-run file")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = " ".join(proc.stdout.split())
    reason = "reason: review still requests changes after 2 round(s) (limits.max_pr_review_rounds)"
    assert "dry run: pr_review · paused" in out
    assert reason in out
    assert "✓ pr_reviewed r1 request_changes" in out and "✓ pr_reviewed r2 request_changes" in out
    assert "was not touched; the clone was removed" in out
    assert snapshot(repo) == before
    assert not (repo / ".phasegate").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "sandbox",
    [
        pytest.param('sandbox = "none"\n', id="none"),
        pytest.param("", id="default", marks=pytest.mark.sandboxed),  # bwrap where it works
    ],
)
def test_a_dry_run_on_the_codex_cli_completes(tmp_path: Path, sandbox: str) -> None:
    # The clone, and so CODEX_HOME, is under /tmp: unconfined (sandbox = "none",
    # bwrap on PATH) Codex's own bwrap found no codex-linux-sandbox alias there and
    # its build changed no file; confined as root, Codex's bwrap cannot start inside
    # phasegate's, which then confines it alone.
    codex = agent_cli("codex")
    role = (
        f'runner = "codex"\nexecutable = {json.dumps(codex)}\n'
        f'api_key_env = "OPENAI_API_KEY"\ntimeout = 90\n{sandbox}'
    )
    repo = make_user_repo(tmp_path, dict.fromkeys(ROLES, role))
    before = snapshot(repo)
    proc = dry_run(repo, "--json", "Add the dry-run file", env={"OPENAI_API_KEY": SENTINEL})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["workflow"]["status"] == "completed"
    assert {(r["runner"], r["outcome"]) for r in result["agent_runs"]} == {("codex", "ok")}
    assert snapshot(repo) == before
    assert SENTINEL not in proc.stdout + proc.stderr


#: The newer CLI runners, bound as a person would: the program, a model, the real
#: key's variable (unset here: the dry run's dummy key replaces it).
CLI_ROLES = {
    "gemini": ("gemini", 'model = "gemini-2.5-flash"\napi_key_env = "GEMINI_API_KEY"\n'),
    "opencode": (
        "opencode",
        'model = "anthropic/claude-sonnet-4-5"\napi_key_env = "ANTHROPIC_API_KEY"\n',
    ),
    "aider": ("aider", 'model = "openai/gpt-5"\napi_key_env = "OPENAI_API_KEY"\n'),
    "qwen": ("qwen", 'model = "qwen3-coder-plus"\napi_key_env = "OPENAI_API_KEY"\n'),
    "copilot": (
        "copilot",
        'model = "gpt-5.4"\npass_env = ["COPILOT_GITHUB_TOKEN"]\n',
    ),
    "mini-swe-agent": ("mini", 'model = "openai/gpt-5"\napi_key_env = "OPENAI_API_KEY"\n'),
}


#: What the command roles of a dry run print: a plan, and the verdicts.
COMMAND_SAYS = {
    "plan": "1. Write the dry-run file.",
    "plan_review": "VERDICT: approve",
    "verification": "VERDICT: confirmed",
}


@pytest.mark.slow
@pytest.mark.sandboxed
@pytest.mark.parametrize("runner", sorted(CLI_ROLES))
def test_a_dry_run_on_each_newer_cli_runner_completes_offline(tmp_path: Path, runner: str) -> None:
    cli, model = CLI_ROLES[runner]
    role = f'runner = "{runner}"\nexecutable = {json.dumps(agent_cli(cli))}\n{model}timeout = 120\n'
    # A role that edits and a read-only one on the program; the others as command roles,
    # which a dry run runs as they are (every role on each program: its own test file).
    roles = {name: role for name in ("build", "review")}
    for name, said in COMMAND_SAYS.items():
        roles[name] = f'runner = "command"\ncommand = "echo {said}"\ntimeout = 30\n'
    repo = make_user_repo(tmp_path, roles)
    before = snapshot(repo)
    proc = dry_run(repo, "--json", "Add the dry-run file", env={"GEMINI_API_KEY": SENTINEL})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["workflow"]["status"] == "completed", result["workflow"]
    ran = {(r["role"], r["runner"], r["outcome"]) for r in result["agent_runs"]}
    assert ran == {
        (name, runner if name in ("build", "review") else "command", "ok") for name in ROLES
    }
    assert result["dry_run"]["model_requests"] >= 2
    assert snapshot(repo) == before
    assert SENTINEL not in proc.stdout + proc.stderr


@pytest.mark.slow
def test_a_dry_run_on_the_api_runner_applies_the_scripted_diff(tmp_path: Path) -> None:
    for module in ("litellm", "phasegate.agents.runners.api"):
        if importlib.util.find_spec(module) is None:  # found, not imported: litellm is slow
            pytest.skip(f"{module} is not installed")
    role = (
        'runner = "api"\nmodel = "anthropic/claude-sonnet-4-5"\napi_key_env = "ANTHROPIC_API_KEY"\n'
    )
    roles = dict.fromkeys(ROLES, role)
    roles["verification"] = role.replace("anthropic/claude-sonnet-4-5", "gemini/gemini-2.5-pro")
    repo = make_user_repo(tmp_path, roles)
    before = snapshot(repo)
    proc = dry_run(repo, "--json", "Add the dry-run file")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["workflow"]["status"] == "completed"
    assert {(r["runner"], r["outcome"]) for r in result["agent_runs"]} == {("api", "ok")}
    assert snapshot(repo) == before


def _needs_litellm() -> None:
    for module in ("litellm", "phasegate.agents.runners.api"):
        if importlib.util.find_spec(module) is None:  # found, not imported: litellm is slow
            pytest.skip(f"{module} is not installed")


GRAPH_MODE = (
    "[graph]\nenabled = true\n\n"
    "[graph.review_tiers]\ndefault = 2\n\n"  # the adversary, and always the arbitrator
)


@pytest.mark.slow
def test_a_graph_mode_dry_run_on_the_api_runner_lands_the_scripted_diff(tmp_path: Path) -> None:
    _needs_litellm()
    role = (
        'runner = "api"\nmodel = "anthropic/claude-sonnet-4-5"\napi_key_env = "ANTHROPIC_API_KEY"\n'
    )
    optional = "".join(f"[roles.{name}]\n{role}\n" for name in GRAPH_OPTIONAL_ROLES)
    roles = dict.fromkeys(ROLES, role)
    roles["review"] = role.replace("anthropic/claude-sonnet-4-5", "gemini/gemini-2.5-pro")
    repo = make_user_repo(tmp_path, roles, extra=GRAPH_MODE + optional)
    before = snapshot(repo)

    proc = dry_run(repo, "--json", "Add the dry-run file")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    summary = result["workflow"]
    assert (summary["current_phase"], summary["status"]) == ("completed", "completed"), summary
    assert summary["verification_status"] == "confirmed"
    assert summary["merge_sha"]
    # Every graph role answered through litellm from the scripted model; plan_review,
    # bound but not used in graph mode, was not asked.
    runs = result["agent_runs"]
    assert [(r["role"], r["runner"], r["outcome"]) for r in runs] == [
        (name, "api", "ok")
        for name in (
            "scope_epic",
            "plan",
            "plan_alternative",
            "plan_arbitrate",
            "plan_adversary",
            "build",
            "review",
            "review_adversary",
            "arbitrate",
            "verification",
        )
    ]
    kinds = {(m["kind"], m["status"]) for m in result["milestones"]}
    for kind in ("plan_finalized", "graph_run", "tests_run", "dev_completed", "merge_completed"):
        assert (kind, "completed") in kinds, kind
    [finalized] = [m for m in result["milestones"] if m["kind"] == "plan_finalized"]
    assert finalized["data"]["plan_competition"]["choice"] == "first"
    assert finalized["data"]["plan_attack"]["verdict"] == "proceed"
    info = result["dry_run"]
    assert info["model_requests"] == len(runs)  # one turn each: the build answers with its diff
    assert snapshot(repo) == before
    assert not (repo / ".phasegate").exists()


@pytest.mark.slow
def test_a_graph_mode_script_can_send_the_plan_back_and_the_revision_plays_the_plan_script(
    tmp_path: Path,
) -> None:
    _needs_litellm()
    role = 'runner = "api"\nmodel = "openai/gpt-5"\napi_key_env = "OPENAI_API_KEY"\n'
    extra = f"[graph]\nenabled = true\n\n[roles.plan_adversary]\n{role}\n"
    repo = make_user_repo(tmp_path, dict.fromkeys(ROLES, role), extra=extra)
    script = tmp_path / "attack.toml"
    script.write_text(
        '[plan_adversary]\nsteps = [{ text = "OBJECTION: no step checks the file\\n'
        'VERDICT: revise" }]\n'
        '[plan]\nsteps = [{ text = "1. Create phasegate-dry-run.txt.\\n2. Check it exists." }]\n'
    )
    proc = dry_run(repo, "--json", "--script", str(script), "Add the dry-run file")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["workflow"]["status"] == "completed", result["workflow"]
    assert [r["role"] for r in result["agent_runs"]] == [
        "plan",
        "plan_adversary",
        "plan",  # the revision, asked of the plan's author
        "build",
        "review",
        "verification",
    ]
    [finalized] = [m for m in result["milestones"] if m["kind"] == "plan_finalized"]
    attack = finalized["data"]["plan_attack"]
    assert (attack["verdict"], attack["revised"]) == ("revise", True)
    assert attack["objections"] == ["no step checks the file"]


def codex_role(exe: str) -> str:
    return (
        f'runner = "codex"\nexecutable = {json.dumps(exe)}\n'
        'api_key_env = "OPENAI_API_KEY"\ntimeout = 90\n'
    )


@pytest.mark.slow
@pytest.mark.parametrize(("cli", "runner"), [("claude", "claude-code"), ("codex", "codex")])
def test_a_graph_mode_dry_run_on_an_agent_cli_builds_with_a_diff(
    tmp_path: Path, cli: str, runner: str
) -> None:
    exe = agent_cli(cli)
    role = claude_role(exe) if cli == "claude" else codex_role(exe)
    optional = "".join(
        f"[roles.{name}]\n{role}\n"
        for name in ("plan_adversary", "review_adversary", "arbitrate")  # tier 1 needs both
    )
    extra = "[graph]\nenabled = true\n\n[graph.review_tiers]\ndefault = 1\n\n" + optional
    repo = make_user_repo(tmp_path, dict.fromkeys(ROLES, role), extra=extra)
    before = snapshot(repo)

    proc = dry_run(repo, "--json", "Add the dry-run file", env={"OPENAI_API_KEY": SENTINEL})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["workflow"]["status"] == "completed", result["workflow"]
    runs = result["agent_runs"]
    assert [(r["role"], r["runner"], r["outcome"]) for r in runs] == [
        (name, runner, "ok")
        for name in (
            "plan",
            "plan_adversary",
            "build",
            "review",
            "review_adversary",
            "verification",
        )
    ]
    # The read-only build answered with its diff in one turn; the apply arm landed it.
    assert result["dry_run"]["model_requests"] == len(runs)
    assert ("tests_run", "completed") in {(m["kind"], m["status"]) for m in result["milestones"]}
    assert snapshot(repo) == before
    assert SENTINEL not in proc.stdout + proc.stderr


def test_command_and_scripted_roles_run_as_they_are(tmp_path: Path) -> None:
    roles = dict.fromkeys(ROLES, 'runner = "scripted"\nscript = "answers.toml"\ntimeout = 30\n')
    roles["plan"] = 'runner = "command"\ncommand = "echo 1. write feature.txt"\n'
    repo = make_user_repo(tmp_path, roles)
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)  # not committed: read from the repo
    (repo / "phasegate.toml").write_text(
        (repo / "phasegate.toml").read_text().replace(DRY_RUN_FILE, "feature.txt")
    )
    before = snapshot(repo)
    scratch = tmp_path / "scratch"  # the kept clone lands here, and goes with tmp_path
    scratch.mkdir()
    proc = dry_run(repo, "--keep", "--json", "Add the feature", env={"TMPDIR": str(scratch)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    assert result["workflow"]["status"] == "completed"
    assert [(r["role"], r["runner"]) for r in result["agent_runs"]] == [
        ("plan", "command"),
        *((role, "scripted") for role in ROLES[1:]),
    ]
    info = result["dry_run"]
    assert (info["offline_roles"], info["model_requests"], info["kept"]) == ([], 0, True)
    clone = Path(info["clone"])
    assert clone.parent.parent == scratch
    assert git(clone, "show", "main:feature.txt") == "the feature"  # merged in the clone
    assert git(clone, "remote") == ""  # the clone cannot reach the repository
    assert snapshot(repo) == before


def test_a_paused_dry_run_says_its_reasons_commands_named_the_clones_workflow(
    tmp_path: Path,
) -> None:
    roles = dict.fromkeys(ROLES, 'runner = "scripted"\nscript = "answers.toml"\ntimeout = 30\n')
    roles["build"] = 'runner = "command"\ncommand = "true"\n'  # changes nothing
    repo = make_user_repo(tmp_path, roles, extra="[limits]\nmax_dev_retries = 0\n")
    (repo / "answers.toml").write_text(HAPPY_ANSWERS)
    scratch = tmp_path / "scratch"  # the kept clone lands here, and goes with tmp_path
    scratch.mkdir()
    for keep in ((), ("--keep",)):
        proc = dry_run(repo, *keep, "Add the feature", env={"TMPDIR": str(scratch)})
        assert proc.returncode == 1, proc.stdout + proc.stderr
        out = " ".join(proc.stdout.split())
        assert "dry run: development · paused" in out, out
        assert "`phasegate resume " in out  # the reason's own suggestion, kept as it is
        workflow_id = out.split("`phasegate resume ")[1].split("`")[0]
        said = f"commands above naming {workflow_id}"
        if keep:
            clone = out.split("the clone was kept in ")[1].split()[0]
            assert f"{said} act on the clone's workflow: add `--repo {clone}`" in out, out
        else:
            assert f"{said} named the clone's workflow, which is gone" in out, out


def test_a_bad_script_is_an_error_naming_its_key(tmp_path: Path) -> None:
    repo = make_user_repo(tmp_path, dict.fromkeys(ROLES, 'runner = "command"\ncommand = "true"\n'))
    script = tmp_path / "bad.toml"
    script.write_text('[review]\nsteps = [{ txt = "VERDICT: approve" }]\n')
    proc = dry_run(repo, "--script", str(script), "ticket")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{script}: review.steps[0].txt: unknown key" in " ".join(proc.stderr.split())

    with pytest.raises(ScriptError, match=r"build\.steps: a non-empty array"):
        script.write_text("[build]\nsteps = []\n")
        load_script(script)
    with pytest.raises(ScriptError, match=r"build\.steps\[0\]\.tools\[0\]: a tool call is"):
        script.write_text('[build]\nsteps = [{ tools = ["Write"] }]\n')
        load_script(script)
    with pytest.raises(ScriptError, match="not valid TOML"):
        script.write_text("[build\n")
        load_script(script)


def test_a_missing_agent_cli_stops_the_dry_run_before_anything_runs(tmp_path: Path) -> None:
    role = 'runner = "claude-code"\nexecutable = "/nonexistent/claude"\n'
    repo = make_user_repo(tmp_path, dict.fromkeys(ROLES, role))
    proc = dry_run(repo, "ticket")
    assert proc.returncode == 2
    err = " ".join(proc.stderr.split())
    assert "roles.plan: the claude-code executable `/nonexistent/claude` is not found" in err
    assert "phasegate doctor" in err


def test_a_script_reads_into_steps_and_markers(tmp_path: Path) -> None:
    script = tmp_path / "s.toml"
    script.write_text(
        '["review round 2"]\nsteps = [{ text = "VERDICT: approve" }]\n'
        "[build]\nsteps = [\n"
        '  { tools = [{ name = "Write", input = { file_path = "{cwd}/a", content = "a" } }] },\n'
        '  { text = "done", input_tokens = 7, status = 200 },\n]\n'
    )
    scripts = load_script(script)
    assert list(scripts) == ["review round 2", "build"]
    first, second = scripts["build"]
    assert first.tools[0].name == "Write" and first.tools[0].input["file_path"] == "{cwd}/a"
    assert (second.text, second.input_tokens) == ("done", 7)


def test_each_role_marker_picks_its_own_prompt_only() -> None:
    prompts = {
        "plan": planning.PLAN_PROMPT,
        "plan_review": planning.REVIEW_PROMPT,
        "build": development.BUILD_PROMPT,
        "review": pr_review.REVIEW_PROMPT,
        "verification": acceptance_verification.VERIFY_PROMPT,
    }
    for role, marker in ROLE_MARKERS.items():
        assert len(marker) > 20
        assert [r for r, prompt in prompts.items() if marker in prompt] == [role]


def test_each_graph_role_marker_picks_its_own_graph_prompt_only() -> None:
    facts = change_facts("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n", ())
    change = ("ticket", "plan", 1, "brief", "patch", facts, ())
    prompts = {
        "scope_epic": graph_prompts.scope_prompt("ticket"),
        "plan": graph_prompts.plan_prompt("ticket"),
        "plan_alternative": graph_prompts.plan_alternative_prompt("ticket", "first"),
        "plan_arbitrate": graph_prompts.plan_arbitrate_prompt("ticket", "first", "second"),
        "plan_adversary": graph_prompts.plan_adversary_prompt("ticket", "plan"),
        "plan revision": graph_prompts.plan_revision_prompt("ticket", "plan", "objections"),
        "build": graph_prompts.build_prompt("ticket", "plan", 2, "old patch", "critique", ["x"]),
        "review": graph_prompts.review_prompt(*change),
        "review_adversary": graph_prompts.adversary_prompt(*change, "approve", "findings"),
        "arbitrate": graph_prompts.arbitrate_prompt(*change, "review", "adversary"),
        "verification": acceptance_verification.VERIFY_PROMPT,
    }
    assert set(GRAPH_ROLE_MARKERS) == {"plan", "build", "review", "verification"} | set(
        GRAPH_OPTIONAL_ROLES
    )
    for role, marker in GRAPH_ROLE_MARKERS.items():
        assert len(marker) > 20
        assert [r for r, prompt in prompts.items() if marker in prompt] == [role]


def test_the_graph_mode_defaults_answer_what_each_graph_node_needs() -> None:
    for runner in ("claude-code", "codex", "api", None):
        scripts = default_scripts(runner, graph=True)
        assert "plan_review" not in scripts
        # Read-only, whatever the runner: one turn, a diff in the text, no tool.
        [build] = scripts["build"]
        assert build.tools == ()
        patch, summary = extract_patch(build.text)
        facts = change_facts(patch, ())
        assert facts.paths == (DRY_RUN_FILE,) and facts.insertions == 1 and summary
    text = {role: steps[0].text for role, steps in default_scripts("api", graph=True).items()}
    assert len(items(text["scope_epic"], "subtask")) == 1
    assert text["plan"].startswith("1. ") and text["plan_alternative"].startswith("1. ")
    assert field(text["plan_arbitrate"], "choice") == "first"
    assert field(text["plan_arbitrate"], "price")
    assert verdict(text["plan_adversary"], ("proceed", "revise")) == "proceed"
    for role in ("review", "review_adversary", "arbitrate"):
        assert verdict(text[role], REVIEW_VERDICTS) == "approve", role
    assert verdict(text["verification"], ("confirmed",)) == "confirmed"
    # Outside graph mode the defaults are as they were.
    assert set(default_scripts("claude-code")) == set(ROLES)
    assert default_scripts("claude-code")["build"][0].tools[0].name == "Write"


def test_offline_binding_keeps_the_role_and_replaces_model_and_key() -> None:
    claude = RoleBinding(
        runner="claude-code",
        executable="/opt/claude",
        api_key_env="ANTHROPIC_API_KEY",
        allowed_tools=["Read", "Write"],
        max_turns=5,
        timeout=42,
        pass_env=["HTTPS_PROXY", "GITHUB_TOKEN"],
        env={"FOO": "1", "ANTHROPIC_AUTH_TOKEN": SENTINEL},
    )
    offline = offline_binding(claude, "http://127.0.0.1:9")
    assert (offline.runner, offline.executable, offline.allowed_tools) == (
        "claude-code",
        "/opt/claude",
        ["Read", "Write"],
    )
    assert (offline.max_turns, offline.timeout) == (5, 42)
    assert (offline.base_url, offline.api_key_env) == ("http://127.0.0.1:9", None)
    assert offline.pass_env == ["HTTPS_PROXY"]
    assert offline.env == {
        "FOO": "1",
        "ANTHROPIC_API_KEY": DUMMY_KEY,
        "CLAUDE_CODE_MAX_RETRIES": "0",
    }

    codex = offline_binding(RoleBinding(runner="codex", model="gpt-5"), "http://h:1")
    assert (codex.base_url, codex.model, codex.env["OPENAI_API_KEY"]) == (
        "http://h:1/v1",
        "gpt-5",
        DUMMY_KEY,
    )
    assert "model_providers.phasegate.request_max_retries=0" in codex.extra_args

    api = offline_binding(RoleBinding(runner="api", model="anthropic/claude-x"), "http://h:1")
    assert (api.model, api.base_url) == ("anthropic/claude-x", "http://h:1")
    other = offline_binding(RoleBinding(runner="api", model="gemini/gemini-2.5-pro"), "http://h:1")
    assert (other.model, other.base_url) == ("openai/gemini-2.5-pro", "http://h:1/v1")
    assert other.env[other.api_key_env or ""] == DUMMY_KEY

    for runner in ("qwen", "copilot"):
        bound = offline_binding(
            RoleBinding(runner=runner, model="vendor/m-1", pass_env=["COPILOT_GITHUB_TOKEN"]),
            "http://h:1",
        )
        assert (bound.model, bound.base_url, bound.pass_env) == ("m-1", "http://h:1/v1", [])
        assert bound.env[bound.api_key_env or ""] == DUMMY_KEY
    mini = offline_binding(RoleBinding(runner="mini-swe-agent", model="openai/gpt-5"), "http://h:1")
    assert (mini.model, mini.base_url) == ("openai/gpt-5", "http://h:1/v1")
    assert mini.env["MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT"] == "1"
    assert mini.extra_args == ["-c", "model.model_kwargs.max_retries=0"]

    command = RoleBinding(runner="command", command="my-agent")
    assert offline_binding(command, "http://h:1") is command


def test_a_mini_swe_agent_role_s_default_turns_all_call_its_bash_tool() -> None:
    runners = dict.fromkeys(ROLES, "mini-swe-agent")
    for graph in (False, True):
        scripts = default_scripts("mini-swe-agent", graph=graph, runners=runners)
        for role, steps in scripts.items():
            if role in runners:
                assert all(s.tools and s.tools[0].name == "bash" for s in steps), role
                assert "COMPLETE_TASK_AND_SUBMIT" in steps[-1].tools[0].input["command"], role
    # Another runner's roles keep their plain answers.
    mixed = default_scripts("claude-code", runners={"review": "mini-swe-agent"})
    assert not mixed["plan"][0].tools and mixed["review"][0].tools


def test_the_docs_script_example_loads(tmp_path: Path) -> None:
    page = Path(__file__).resolve().parent.parent / "docs" / "doctor-dry-run.md"
    section = page.read_text()
    example = section.split("```toml\n", 1)[1].split("```", 1)[0]
    script = tmp_path / "example.toml"
    script.write_text(example)
    scripts = load_script(script)
    assert list(scripts) == ["review", "review round 2", "build"]
    assert scripts["review"][0].text == "Needs a test.\nVERDICT: request_changes"
    assert scripts["build"][0].tools[0].input == {"file_path": "{cwd}/hi.txt", "content": "hi\n"}
