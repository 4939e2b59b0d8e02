"""``phasegate doctor`` and ``phasegate init``: what this machine and repository offer.

The agent CLIs here are small shell scripts on a PATH the test builds, so what
is "found" is under the test's control; the model keys are sentinels that must
never appear in any output.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phasegate.config.cartridge import load_cartridge
from phasegate.tools import doctor
from phasegate.tools.discover import CheckGuess, detect_base_branch, detect_checks, program_version
from phasegate.tools.doctor import diagnose
from phasegate.tools.init import default_cartridge
from phasegate.tools.sample_agent import SAMPLE_COMMAND

from conftest import ROLES, git, make_repo

SENTINEL = "zq7Kx-doctor-sentinel-9f2e1d"


def fake_cli(bin_dir: Path, name: str, version: str = "9.9.9", *, sleep: int = 0) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\n{'sleep ' + str(sleep) if sleep else ''}\necho '{version}'\n")
    path.chmod(0o755)
    return path


def bare_path(tmp_path: Path, *clis: str) -> str:
    """A PATH holding git and the named fake CLIs, and nothing else."""
    bin_dir = tmp_path / ("path-" + "-".join(clis))
    if bin_dir.exists():
        return str(bin_dir)
    bin_dir.mkdir()
    git_exe = shutil.which("git")
    assert git_exe
    (bin_dir / "git").symlink_to(git_exe)
    for name in clis:
        fake_cli(bin_dir, name, f"9.9.9 ({name})")
    return str(bin_dir)


def phasegate(*args: str, env: dict[str, str], cwd: Path | None = None):
    """The real console script with exactly ``env`` (plus git's identity) as environment."""
    # PYTHONPATH too: the console script then runs the code under test, wherever it is.
    keep = {k: v for k, v in os.environ.items() if k.startswith("GIT_") or k == "PYTHONPATH"}
    exe = Path(sys.executable).parent / "phasegate"
    return subprocess.run(
        [str(exe), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**keep, "COLUMNS": "200", "HOME": str(Path.home()), **env},
    )


def role_table(role: str, body: str) -> str:
    return f"[roles.{role}]\n{body}\n"


def claude_roles(exe: Path, key: str = "ANTHROPIC_API_KEY") -> str:
    body = f'runner = "claude-code"\nexecutable = "{exe}"\napi_key_env = "{key}"\n'
    return "\n".join(role_table(r, body) for r in ROLES)


def write_cartridge(repo: Path, text: str) -> None:
    (repo / "phasegate.toml").write_text(
        '[workflow]\nbase_branch = "main"\n[landing_areas]\nchecks = ["true"]\n\n' + text
    )


def assert_no_secret(*outputs: str) -> None:
    for text in outputs:
        assert SENTINEL not in text
        assert SENTINEL[:6] not in text  # not even a prefix


# -- doctor ----------------------------------------------------------------------------------


def test_doctor_on_a_ready_repository_exits_0_and_never_shows_a_key(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    claude = fake_cli(tmp_path / "tools", "claude", "2.1.197 (Claude Code)")
    write_cartridge(repo, claude_roles(claude))
    env = {
        "PATH": bare_path(tmp_path, "codex"),
        "ANTHROPIC_API_KEY": SENTINEL,
        "GEMINI_API_KEY": SENTINEL + "-g",
    }

    proc = phasegate("doctor", "--repo", str(repo), "--json", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = json.loads(proc.stdout)
    assert found["ok"] is True and found["missing"] == []
    assert found["repo"] == str(repo) and found["git"]
    assert found["cartridge"]["valid"] is True
    clis = {c["name"]: c for c in found["agent_clis"]}
    assert clis["claude"]["path"] is None  # not on PATH: the cartridge names its own
    assert clis["codex"]["version"] == "9.9.9 (codex)"
    assert clis[str(claude)]["version"] == "2.1.197 (Claude Code)"
    assert found["keys"]["ANTHROPIC_API_KEY"] is True
    assert found["keys"]["GEMINI_API_KEY"] is True
    assert found["keys"]["OPENAI_API_KEY"] is False
    assert [r["role"] for r in found["roles"]] == list(ROLES)
    for role in found["roles"]:
        assert role["runner"] == "claude-code"
        assert (role["executable"], role["resolved"]) == (str(claude), str(claude))
        assert (role["api_key_env"], role["api_key_set"]) == ("ANTHROPIC_API_KEY", True)

    text = phasegate("doctor", "--repo", str(repo), env=env)
    assert text.returncode == 0, text.stderr
    assert "ready: everything a run needs is there" in text.stdout
    assert "2.1.197 (Claude Code)" in text.stdout
    assert "set: ANTHROPIC_API_KEY, GEMINI_API_KEY" in text.stdout
    assert_no_secret(proc.stdout, proc.stderr, text.stdout, text.stderr)
    assert not (repo / ".phasegate").exists(), "doctor only looks: it makes no state directory"


def test_doctor_names_everything_a_run_is_missing_and_exits_1(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    claude = fake_cli(tmp_path / "tools", "claude")
    write_cartridge(
        repo,
        role_table("plan", f'runner = "claude-code"\nexecutable = "{claude}"')
        + role_table("plan_review", 'runner = "codex"\nexecutable = "no-such-codex"')
        + role_table(
            "review",
            f'runner = "claude-code"\nexecutable = "{claude}"\napi_key_env = "MY_UNSET_KEY"',
        )
        + role_table("verification", 'runner = "command"\ncommand = "echo VERDICT: confirmed"'),
    )
    proc = phasegate("doctor", "--repo", str(repo), "--json", env={"PATH": bare_path(tmp_path)})
    assert proc.returncode == 1, proc.stderr
    found = json.loads(proc.stdout)
    assert found["ok"] is False
    missing = "\n".join(found["missing"])
    assert "roles.build is not bound" in missing
    assert "roles.plan_review: the codex executable `no-such-codex` is not found" in missing
    assert "npm install -g @openai/codex" in missing
    assert "roles.review: api_key_env MY_UNSET_KEY is not set" in missing
    assert len(found["missing"]) == 3
    roles = {r["role"]: r for r in found["roles"]}
    assert roles["build"]["bound"] is False
    assert (roles["plan_review"]["executable"], roles["plan_review"]["resolved"]) == (
        "no-such-codex",
        None,
    )
    assert roles["review"]["api_key_set"] is False
    assert found["keys"]["MY_UNSET_KEY"] is False
    assert roles["verification"]["runner"] == "command"
    # a claude-code role naming no key works only if something else provides one
    assert any("roles.plan: no api_key_env" in w for w in found["warnings"])

    text = phasegate("doctor", "--repo", str(repo), env={"PATH": bare_path(tmp_path)})
    assert text.returncode == 1
    assert "missing (3)" in text.stdout
    assert "roles.build is not bound" in text.stdout


def test_doctor_looks_for_a_command_roles_program_not_for_its_shells_own_words(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo")
    commands = {
        "plan": "for i in 1 2; do echo step $i; done",
        "plan_review": "cd sub && ./review.sh",
        "build": "MODE=fast exec no-such-builder --all",
        "review": "(git diff | wc -l)",
        "verification": "echo VERDICT: confirmed",
    }
    write_cartridge(
        repo,
        "".join(
            role_table(role, f'runner = "command"\ncommand = {json.dumps(command)}')
            for role, command in commands.items()
        ),
    )
    proc = phasegate("doctor", "--repo", str(repo), "--json", env={"PATH": bare_path(tmp_path)})
    found = json.loads(proc.stdout)
    roles = {r["role"]: r for r in found["roles"]}
    named = [m for m in found["missing"] if "the first word of its command" in m]
    # the program after the assignment and exec is looked for, and not found: a run
    # would exit 127, so doctor is not ready
    assert named == [
        "roles.build: `no-such-builder` (the first word of its command) is not found on PATH"
    ]
    assert proc.returncode == 1 and not found["ok"]
    assert (roles["build"]["executable"], roles["build"]["resolved"]) == ("no-such-builder", None)
    for role in ("plan", "plan_review", "review", "verification"):  # the shell's own words
        assert roles[role]["executable"] is None, roles[role]


def test_doctor_warns_of_a_notify_webhook_env_that_is_not_set(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    claude = fake_cli(tmp_path / "tools", "claude")
    write_cartridge(
        repo, claude_roles(claude) + '[notify]\nwebhook_env = "TEAM_HOOK"\ndesktop = false\n'
    )
    env = {"PATH": bare_path(tmp_path), "ANTHROPIC_API_KEY": SENTINEL}
    unset = json.loads(phasegate("doctor", "--repo", str(repo), "--json", env=env).stdout)
    assert (
        "notify.webhook_env: TEAM_HOOK is not set; no webhook notification is sent"
        in (unset["warnings"])
    )
    hook = "https://hooks.example/" + SENTINEL
    given = phasegate("doctor", "--repo", str(repo), "--json", env={**env, "TEAM_HOOK": hook})
    assert not any("webhook_env" in w for w in json.loads(given.stdout)["warnings"])
    assert hook not in given.stdout


def test_doctor_asks_for_litellm_when_a_role_is_on_the_api_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_repo(tmp_path / "repo")
    body = 'runner = "api"\nmodel = "openai/gpt-5"\napi_key_env = "OPENAI_API_KEY"'
    write_cartridge(repo, "\n".join(role_table(r, body) for r in ROLES))
    monkeypatch.setattr(doctor, "_litellm_installed", lambda: False)
    found = diagnose(repo, environ={"OPENAI_API_KEY": SENTINEL})
    assert found.missing == [
        f"roles.{r}: the api runner needs litellm: pip install 'phasegate[api]'" for r in ROLES
    ]
    assert found.litellm is False
    assert_no_secret(json.dumps(found.as_dict()))


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[limits]\nmax_plan_rounds = 'three'\n", "limits.max_plan_rounds"),
        ('[roles.build]\nrunner = "claude-code"\nscript = "x.toml"\n', "roles.build"),
        (
            '[autonomy]\npolicy = { draft_pr_creat = "auto" }\n',
            "phasegate.toml: autonomy.policy.draft_pr_creat: unknown proposal kind",
        ),
        ("[limits\n", "not valid TOML"),
    ],
)
def test_doctor_reports_a_bad_cartridge_by_its_key(tmp_path: Path, text: str, named: str) -> None:
    repo = make_repo(tmp_path / "repo")
    ok_plan = role_table("plan", 'runner = "command"\ncommand = "echo 1. plan"')
    broken_toml = text == "[limits\n"
    (repo / "phasegate.toml").write_text(text if broken_toml else text + "\n" + ok_plan)
    proc = phasegate("doctor", "--repo", str(repo), "--json", env={"PATH": bare_path(tmp_path)})
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    found = json.loads(proc.stdout)
    assert found["cartridge"]["valid"] is False
    assert named in found["cartridge"]["error"]
    assert any(named in m for m in found["missing"])
    if not broken_toml:
        # the roles that are fine are still shown
        roles = {r["role"]: r for r in found["roles"]}
        assert roles["plan"]["runner"] == "command"
    text_proc = phasegate("doctor", "--repo", str(repo), env={"PATH": bare_path(tmp_path)})
    assert text_proc.returncode == 1 and "Traceback" not in text_proc.stderr
    assert named in " ".join(text_proc.stdout.split())


def graph_cartridge(marker: Path, *, arbitrate: bool) -> str:
    """A graph-mode cartridge at tier 1; every role writes ``marker`` if it is ever run."""
    body = f'runner = "command"\ncommand = "touch {marker}"'
    roles = ["plan", "build", "review", "verification", "review_adversary"]
    return "[graph]\nenabled = true\n\n[graph.review_tiers]\ndefault = 1\n\n" + "\n".join(
        role_table(r, body) for r in [*roles, *(["arbitrate"] * arbitrate)]
    )


def test_doctor_on_an_invalid_graph_mode_cartridge_lists_the_graph_roles(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo")
    marker = tmp_path / "ran"
    write_cartridge(repo, graph_cartridge(marker, arbitrate=False))
    found = diagnose(repo, which=lambda name: f"/usr/bin/{name}", environ={})
    assert found.cartridge["valid"] is False
    expected = (
        f"{repo / 'phasegate.toml'}: graph.review_tiers.default: tier 1 needs "
        "[roles.review_adversary] and [roles.arbitrate] (the arbitrator decides when the "
        "reviewer and the adversary disagree); [roles.arbitrate] is not bound"
    )
    assert found.cartridge["error"] == expected
    assert found.missing == [f"the cartridge is invalid: {expected}"]
    # Graph mode does not ask plan_review: the raw read lists what the graph would.
    assert [r.role for r in found.roles] == [
        "plan",
        "build",
        "review",
        "verification",
        "review_adversary",
    ]
    assert all(r.bound and r.runner == "command" for r in found.roles)
    assert not any("plan_review" in m for m in [*found.missing, *found.warnings])

    # `phasegate run` refuses the same cartridge by its key before any agent runs.
    proc = phasegate(
        "run", "--repo", str(repo), "Add multiply()", env={"PATH": bare_path(tmp_path)}
    )
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    out = " ".join((proc.stdout + proc.stderr).split())
    assert "graph.review_tiers.default: tier 1 needs" in out and "(top level)" not in out
    assert not marker.exists()

    # Bound, the arbitrator makes it valid; doctor lists it with the optional roles.
    write_cartridge(repo, graph_cartridge(marker, arbitrate=True))
    found = diagnose(repo, which=lambda name: f"/usr/bin/{name}", environ={})
    assert found.cartridge["valid"] is True
    assert [r.role for r in found.roles][-2:] == ["review_adversary", "arbitrate"]
    assert "plan_review" not in [r.role for r in found.roles]


def test_doctor_reads_an_invalid_classic_cartridge_s_classic_roles(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    # graph.enabled given but not a bool: not graph mode, and an error by its key.
    write_cartridge(
        repo,
        '[graph]\nenabled = "yes"\n\n' + role_table("plan", 'runner = "command"\ncommand = "true"'),
    )
    found = diagnose(repo, which=lambda name: f"/usr/bin/{name}", environ={})
    assert found.cartridge["valid"] is False and "graph.enabled" in found.cartridge["error"]
    assert [r.role for r in found.roles] == list(ROLES)


def test_doctor_outside_a_repository_says_so(tmp_path: Path) -> None:
    proc = phasegate("doctor", "--repo", str(tmp_path), "--json", env={"PATH": bare_path(tmp_path)})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    found = json.loads(proc.stdout)
    assert found["repo"] is None
    assert any("not inside a git repository" in m for m in found["missing"])


def test_a_cli_that_hangs_on_version_is_reported_within_the_timeout(tmp_path: Path) -> None:
    slow = fake_cli(tmp_path / "bin", "claude", sleep=30)
    started = time.monotonic()
    version, error = program_version(str(slow), timeout_s=0.5)
    assert time.monotonic() - started < 5
    assert version is None and "no answer within 0.5s" in (error or "")


# -- init: what it finds -------------------------------------------------------------------


def checks_of(tmp_path: Path, files: dict[str, str]) -> list[str]:
    root = tmp_path / "p"
    for name, content in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(content)
    return [c.command for c in detect_checks(root)]


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"tests/test_a.py": ""}, ["python -m pytest -q"]),
        ({"pyproject.toml": "[tool.pytest.ini_options]\n"}, ["python -m pytest -q"]),
        ({"setup.cfg": "[tool:pytest]\n"}, ["python -m pytest -q"]),
        ({"tests/fixture.json": "{}", "README.md": ""}, []),
        ({"package.json": '{"scripts": {"test": "vitest run"}}'}, ["npm test"]),
        # what `npm init` writes is not a test suite
        (
            {
                "package.json": '{"scripts": {"test": '
                '"echo \\"Error: no test specified\\" && exit 1"}}'
            },
            [],
        ),
        ({"Cargo.toml": "[package]\n"}, ["cargo test"]),
        ({"go.mod": "module x\n"}, ["go test ./..."]),
        (
            {"go.mod": "module x\n", "package.json": '{"scripts": {"test": "jest"}}'},
            ["npm test", "go test ./..."],
        ),
        ({"Makefile": "test:\n\tpytest\n", "tests/test_a.py": ""}, ["make test"]),
        ({"Makefile": "build:\n\tcc x.c\n"}, []),
        ({}, []),
    ],
)
def test_detect_checks_from_the_repository_files(
    tmp_path: Path, files: dict[str, str], expected: list[str]
) -> None:
    assert checks_of(tmp_path, files) == expected


def test_detect_base_branch(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    assert detect_base_branch(repo) == ("main", "the current branch")
    git(repo, "checkout", "-q", "-b", "feature/x")
    assert detect_base_branch(repo) == ("main", "the repository's trunk")
    only = make_repo(tmp_path / "only")
    git(only, "branch", "-m", "main", "dev")
    assert detect_base_branch(only) == ("dev", "the current branch")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(only), str(clone))
    git(clone, "checkout", "-q", "-b", "topic")
    assert detect_base_branch(clone) == ("dev", "the remote's default branch")


def loads(tmp_path: Path, text: str):
    repo = tmp_path / "load"
    repo.mkdir(exist_ok=True)
    (repo / "phasegate.toml").write_text(text)
    return load_cartridge(repo)


def found(*names: str):
    return lambda name: f"/opt/bin/{name}" if name in names else None


def test_init_binds_claude_code_when_claude_is_found(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", {"tests/test_x.py": "def test(): pass\n"})
    chosen = default_cartridge(
        repo, which=found("claude", "codex"), environ={"ANTHROPIC_API_KEY": SENTINEL}
    )
    assert (chosen.runner, chosen.executable, chosen.api_key_env) == (
        "claude-code",
        "/opt/bin/claude",
        "ANTHROPIC_API_KEY",
    )
    assert chosen.checks == (CheckGuess("python -m pytest -q", "tests/ with Python files"),)
    assert chosen.base_branch == "main"
    cartridge = loads(tmp_path, chosen.text)
    for role in ROLES:
        binding = cartridge.role(role)
        assert (binding.runner, binding.api_key_env) == ("claude-code", "ANTHROPIC_API_KEY")
    assert cartridge.landing_areas.checks == ["python -m pytest -q"]
    assert_no_secret(chosen.text)

    # without the key, no api_key_env is bound, and a note says why it matters
    keyless = default_cartridge(repo, which=found("claude"), environ={})
    assert keyless.api_key_env is None
    assert all(loads(tmp_path, keyless.text).role(r).api_key_env is None for r in ROLES)
    assert any("ANTHROPIC_API_KEY is not set" in n for n in keyless.notes)


def test_init_falls_back_to_codex_then_the_api_runner_then_examples(tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo")
    codex = default_cartridge(repo, which=found("codex"), environ={"OPENAI_API_KEY": SENTINEL})
    assert (codex.runner, codex.api_key_env) == ("codex", "OPENAI_API_KEY")
    assert loads(tmp_path, codex.text).role("build").runner == "codex"

    api = default_cartridge(repo, which=found(), environ={"ANTHROPIC_API_KEY": SENTINEL})
    assert (api.runner, api.model, api.api_key_env) == (
        "api",
        "anthropic/claude-sonnet-4-5",
        "ANTHROPIC_API_KEY",
    )
    assert loads(tmp_path, api.text).role("plan").model == "anthropic/claude-sonnet-4-5"
    openai = default_cartridge(repo, which=found(), environ={"OPENAI_API_KEY": SENTINEL})
    assert (openai.model, openai.api_key_env) == ("openai/gpt-5", "OPENAI_API_KEY")

    # nothing found: every role runs the sample agent through one agent profile
    nothing = default_cartridge(repo, which=found(), environ={})
    assert (nothing.runner, nothing.sample_agent, nothing.command) == (
        "command",
        True,
        SAMPLE_COMMAND,
    )
    assert str(repo) not in nothing.text  # no path of this checkout: any clone runs it
    sampled = loads(tmp_path, nothing.text)
    for role in ROLES:
        binding = sampled.role(role)
        assert (binding.runner, binding.agent, binding.command) == (
            "command",
            "sample",
            nothing.command,
        )
    # a real agent is bound by editing the cartridge; --force only starts over
    bind = next(n for n in nothing.notes if "to bind a real agent" in n)
    assert "edit [agents.sample]" in bind and "`phasegate init --force` starts over" in bind
    assert not codex.sample_agent and not api.sample_agent
    assert any("no test command was found" in n for n in nothing.notes)
    assert_no_secret(codex.text, api.text, openai.text)


def test_init_binds_gemini_when_it_is_the_only_cli_and_names_every_other_one_found(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo")
    chosen = default_cartridge(
        repo, which=found("gemini", "opencode", "aider"), environ={"GEMINI_API_KEY": SENTINEL}
    )
    assert (chosen.runner, chosen.api_key_env) == ("gemini", "GEMINI_API_KEY")
    assert loads(tmp_path, chosen.text).role("review").runner == "gemini"
    also = [n for n in chosen.notes if n.startswith("also found:")]
    assert len(also) == 1 and "opencode (" in also[0] and "aider (" in also[0]
    assert "and a model" in also[0]
    # a program that needs a model named is never bound by init, only named
    only = default_cartridge(repo, which=found("opencode"), environ={})
    assert only.runner == "command" and only.sample_agent
    assert any(n.startswith("also found: opencode (") for n in only.notes)
    assert_no_secret(chosen.text)


def test_init_prints_what_it_chose(tmp_path: Path) -> None:
    repo = make_repo(
        tmp_path / "repo", {"pyproject.toml": "[tool.pytest.ini_options]\n", "README.md": "x\n"}
    )
    env = {"PATH": bare_path(tmp_path, "claude"), "ANTHROPIC_API_KEY": SENTINEL}
    proc = phasegate("init", "--repo", str(repo), env=env)
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    claude = tmp_path / "path-claude" / "claude"
    assert f"roles: every role on the claude-code runner, {claude}, " in out
    assert "api_key_env = ANTHROPIC_API_KEY" in out
    assert "base branch: main (the current branch)" in out
    assert "check: python -m pytest -q ([tool.pytest] in pyproject.toml)" in out
    # its PATH holds no python: said at once, as doctor would say it
    assert "it cannot run yet: `python` is not on the PATH the checks get" in out, out
    assert "phasegate doctor" in out and "phasegate dry-run" in out
    assert "git add phasegate.toml && git commit" in out  # the run takes the committed one
    assert load_cartridge(repo).role("build").runner == "claude-code"
    assert_no_secret(proc.stdout, proc.stderr, (repo / "phasegate.toml").read_text())
    # an agent was found: no sample agent is written
    assert not (repo / ".phasegate").exists()

    bare = make_repo(tmp_path / "bare")
    proc = phasegate("init", "--repo", str(bare), env={"PATH": bare_path(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())
    assert f"roles: every role runs the sample agent ({SAMPLE_COMMAND}) on the command" in out
    assert "calls no model, spends nothing" in out and "`phasegate init --force` starts" in out
    assert "next: git add phasegate.toml" in out and "phasegate approve-merge ID" in out
    assert load_cartridge(bare).missing_roles() == [] and not (bare / ".phasegate").exists()


def test_doctor_says_which_github_repository_and_credentials_and_names_a_missing_token(
    tmp_path: Path,
) -> None:
    from conftest import scripted_cartridge

    repo = make_repo(tmp_path / "repo", {"README.md": "# r\n"})
    (repo / "phasegate.toml").write_text(
        scripted_cartridge() + '\n[forge]\nkind = "github"\ntoken_env = "WIDGETS_PAT"\n'
    )
    (repo / "answers.toml").write_text("")
    git(repo, "remote", "add", "origin", "git@github.com:octo/widgets.git")
    which = lambda name: f"/usr/bin/{name}"  # noqa: E731
    found = diagnose(repo, which=which, environ={}, offline=True)
    assert found.forge["repository"] == "octo/widgets"
    assert any("WIDGETS_PAT is not set" in m for m in found.missing), found.missing

    found = diagnose(repo, which=which, environ={"WIDGETS_PAT": SENTINEL}, offline=True)
    assert found.forge == {
        "kind": "github",
        "api": "https://api.github.com",
        "repository": "octo/widgets",
        "credentials": "the token in WIDGETS_PAT",
        "access": "unknown",
    }
    assert not [m for m in found.missing if "forge" in m]
    assert SENTINEL not in json.dumps(found.as_dict())


def test_a_cli_without_version_option_that_names_its_version_in_a_banner_is_found(
    tmp_path: Path,
) -> None:
    # mini-swe-agent 2.4.6: the banner, then "No such option: --version", exit 2.
    mini = tmp_path / "mini"
    mini.write_text(
        "#!/bin/sh\necho 'This is mini-swe-agent version 2.4.6.'\n"
        "echo 'No such option: --version' >&2\nexit 2\n"
    )
    mini.chmod(0o755)
    assert program_version(str(mini)) == ("This is mini-swe-agent version 2.4.6.", None)
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'Error: no such option --version'\nexit 2\n")
    broken.chmod(0o755)
    version, error = program_version(str(broken))
    assert version is None and error and "exited with code 2" in error


def test_doctor_notes_the_sample_agent_and_refuses_an_older_inits_missing_script(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo")
    text = default_cartridge(repo, which=found(), environ={}).text
    (repo / "phasegate.toml").write_text(text)
    found_now = diagnose(repo, which=shutil.which, environ={}, offline=True)
    assert found_now.ok, found_now.missing
    note = next(w for w in found_now.warnings if "stand-in sample agent" in w)
    assert note.startswith("plan, plan_review, build, review, verification: bound to")
    # an older init bound the roles to a script in one checkout's ignored folder
    script = repo / ".phasegate" / "sample-agent.sh"
    old = text.replace(f"command = '{SAMPLE_COMMAND}'", f"command = \"sh '{script}'\"")
    (repo / "phasegate.toml").write_text(old)
    clone = diagnose(repo, which=shutil.which, environ={}, offline=True)
    said = [m for m in clone.missing if "older init's .phasegate/sample-agent.sh" in m]
    assert len(said) == 1 and SAMPLE_COMMAND in said[0], clone.missing
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    here = diagnose(repo, which=shutil.which, environ={}, offline=True)
    assert here.ok and any("older init's" in w for w in here.warnings), here.missing
