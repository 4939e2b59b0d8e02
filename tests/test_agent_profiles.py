"""Agent profiles and MCP servers.

A profile (``[agents.<name>]``) is a binding with a name that roles refer to,
each with keys of its own over it; its ``mcp_servers`` reach the program in the
program's own configuration. The first tests need no CLI; then one whole
workflow on the real Claude Code with two roles on one profile and two models,
and for each program that takes MCP servers, a call in which the program starts
phasegate's probe server (``phasegate.testing.mcp_probe``) and offers its tool
to the scripted model.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
import tomllib
from pathlib import Path
from typing import Any

import pytest

from phasegate.agents import make_runner
from phasegate.agents.base import AgentRequest
from phasegate.agents.runners.claude_code import ClaudeCodeRunner
from phasegate.config.cartridge import (
    Cartridge,
    CartridgeError,
    McpServer,
    RoleBinding,
    load_cartridge,
)
from phasegate.testing.mcp_probe import TOOL
from phasegate.testing.model_server import ScriptedModelServer, Step, ToolCall
from phasegate.tools.doctor import diagnose

from agent_cli_kit import BUILD, PLAN, PLAN_REVIEW, REVIEW, VERIFY, make_project, run_ticket, show
from conftest import agent_cli, git, make_repo

PROFILES = {
    "agents": {
        "claude": {
            "runner": "claude-code",
            "model": "model-fast",
            "env": {"A": "profile", "B": "profile"},
            "mcp_servers": {"docs": {"command": "docs-mcp", "args": ["--stdio"]}},
        }
    }
}


def _cartridge(roles: dict[str, Any]) -> Cartridge:
    return Cartridge.model_validate({**PROFILES, "roles": roles})


def test_a_profile_used_by_two_roles_gives_each_its_own_model() -> None:
    cartridge = _cartridge(
        {
            "plan": {"agent": "claude", "model": "model-deep", "env": {"B": "plan"}},
            "review": "claude",
        }
    )
    plan, review = cartridge.role("plan"), cartridge.role("review")
    assert (plan.runner, plan.agent, plan.model) == ("claude-code", "claude", "model-deep")
    assert (review.runner, review.agent, review.model) == ("claude-code", "claude", "model-fast")
    # env and mcp_servers merge entry by entry; the role's value wins
    assert plan.env == {"A": "profile", "B": "plan"} and review.env["B"] == "profile"
    assert set(plan.mcp_servers) == set(review.mcp_servers) == {"docs"}

    def model_of(binding: RoleBinding) -> str:
        argv = ClaudeCodeRunner(binding).argv(_request(Path("/nonexistent"), read_only=True))
        return argv[argv.index("--model") + 1]

    assert (model_of(plan), model_of(review)) == ("model-deep", "model-fast")


@pytest.mark.parametrize(
    ("roles", "agents", "message"),
    [
        ({"plan": "nope"}, {}, "roles.plan.agent: no agent profile 'nope'"),
        (
            {"plan": {"agent": "claude", "runner": "codex"}},
            None,
            "roles.plan.runner: the role takes its runner from agent profile 'claude'",
        ),
        ({"plan": {"agent": "claude", "command": "x"}}, None, "`command` is not used by runner"),
        (
            {},
            {"x": {"runner": "command", "command": "true", "mcp_servers": {"a": {"command": "b"}}}},
            "`mcp_servers` is not used by runner 'command'",
        ),
        (
            {},
            {"x": {"runner": "codex", "mcp_servers": {"a": {"command": "b", "url": "http://h"}}}},
            "give `command` (a server it starts) or `url`, not both",
        ),
        (
            {},
            {"x": {"runner": "codex", "mcp_servers": {"a": {"args": ["--stdio"]}}}},
            "agents.x.mcp_servers.a: give `command` (a server it starts) or `url` (one it reaches)",
        ),
        (
            {},
            {"x": {"runner": "codex", "mcp_servers": {"a": {"command": " "}}}},
            "`command` is empty",
        ),
        ({}, {"x": {"runner": "codex", "agent": "y"}}, "agents.x.agent: a profile cannot name"),
    ],
)
def test_a_bad_profile_or_reference_is_refused_naming_the_key(
    tmp_path: Path, roles: dict, agents: dict | None, message: str
) -> None:
    agents = PROFILES["agents"] if agents is None else agents
    (tmp_path / "phasegate.toml").write_text(_toml({"agents": agents, "roles": roles}))
    with pytest.raises(CartridgeError) as caught:
        load_cartridge(tmp_path)
    assert message in str(caught.value)
    assert str(tmp_path / "phasegate.toml") in str(caught.value)


def _toml(data: dict[str, Any]) -> str:
    """A small TOML writer for the tables above (strings, lists, nested tables)."""
    lines: list[str] = []

    def table(prefix: str, values: dict[str, Any]) -> None:
        scalars = {k: v for k, v in values.items() if not isinstance(v, dict)}
        if prefix and (scalars or not values):
            lines.append(f"[{prefix}]")
        for key, value in scalars.items():
            lines.append(f"{json.dumps(key)} = {json.dumps(value)}")
        for key, value in values.items():
            if isinstance(value, dict):
                table(f"{prefix}.{json.dumps(key)}" if prefix else json.dumps(key), value)

    table("", data)
    text = "\n".join(lines) + "\n"
    tomllib.loads(text)  # what the test writes is TOML
    return text


def _request(cwd: Path, *, read_only: bool, prompt: str = f"{REVIEW}: look") -> AgentRequest:
    return AgentRequest(
        workflow_id="wf",
        phase="pr_review",
        role="review" if read_only else "build",
        session_line="review" if read_only else "main",
        prompt=prompt,
        cwd=cwd,
        timeout_s=90.0,
        read_only=read_only,
        state_dir=cwd.parent / "state",
    )


def _probe(log: Path) -> McpServer:
    return McpServer(
        command=sys.executable,
        args=["-m", "phasegate.testing.mcp_probe", str(log)],
        env={"PHASEGATE_PROBE_MARK": "from-the-binding"},
    )


def _offered(server: ScriptedModelServer, marker: str) -> str:
    """The tool declarations of the first request of ``marker``'s script, as JSON."""
    played = server.played(marker)
    assert played, [r.path for r in server.requests]
    body = played[0].body
    return json.dumps(body.get("tools", []))


# -- the real programs ------------------------------------------------------------


def _claude_profile(exe: str, url: str, *, probe: bool) -> str:
    """An ``[agents.claude]`` profile on the real Claude Code; ``probe``: with the
    probe MCP server (no log: a confined run cannot write outside its checkout)."""
    servers = ""
    if probe:
        args = json.dumps(["-m", "phasegate.testing.mcp_probe"])
        servers = f"\n[agents.claude.mcp_servers.probe]\ncommand = {json.dumps(sys.executable)}\n"
        servers += f"args = {args}\n"
    return (
        "[agents.claude]\n"
        'runner = "claude-code"\n'
        f"executable = {json.dumps(exe)}\n"
        f"base_url = {json.dumps(url)}\n"
        'model = "model-fast"\n'
        'api_key_env = "ANTHROPIC_API_KEY"\n'
        "timeout = 60\n"
        'env = { CLAUDE_CODE_MAX_RETRIES = "0" }\n' + servers
    )


@pytest.mark.slow
@pytest.mark.sandboxed
def test_a_whole_workflow_with_two_roles_on_one_profile_and_two_models_on_the_real_claude(
    tmp_path: Path, server_factory
) -> None:
    claude = agent_cli("claude")
    write = ToolCall("Write", {"file_path": "{cwd}/feature.txt", "content": "the feature\n"})
    server = server_factory(
        {
            PLAN: [Step(text="1. Create feature.txt containing 'the feature'.")],
            PLAN_REVIEW: [Step(text="The plan is sound.\nVERDICT: approve")],
            BUILD: [Step(tools=(write,)), Step(text="Created feature.txt.")],
            REVIEW: [Step(text="Correct and minimal.\nVERDICT: approve")],
            VERIFY: [Step(text="feature.txt holds the feature.\nVERDICT: confirmed")],
        }
    )
    deep = 'agent = "claude"\nmodel = "model-deep"\n'
    roles = {"plan": deep, "review": deep}
    roles |= {role: 'agent = "claude"\n' for role in ("plan_review", "build", "verification")}
    repo = make_project(tmp_path, roles, extra=_claude_profile(claude, server.url, probe=True))

    proc = run_ticket(repo, {"ANTHROPIC_API_KEY": "dummy-profile-key"})
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["status"] == "completed", summary
    assert git(repo, "show", "main:feature.txt") == "the feature"

    models = {
        marker: {r.body.get("model") for r in server.played(marker)}
        for marker in (PLAN, PLAN_REVIEW, BUILD, REVIEW, VERIFY)
    }
    assert models == {
        PLAN: {"model-deep"},
        REVIEW: {"model-deep"},
        PLAN_REVIEW: {"model-fast"},
        BUILD: {"model-fast"},
        VERIFY: {"model-fast"},
    }
    # the profile's MCP server was started by every call, confined, and its tool offered
    for marker in (PLAN, BUILD, REVIEW):
        assert f"mcp__probe__{TOOL}" in _offered(server, marker), marker
    runs = show(repo, summary["id"])["agent_runs"]
    assert {r["runner"] for r in runs} == {"claude-code"}


MCP_PROGRAMS = {
    # runner: (the CLI's name for agent_cli, how its binding reaches the scripted server)
    "claude-code": ("claude", lambda url: {"base_url": url, "env": {"ANTHROPIC_API_KEY": "k"}}),
    "codex": (
        "codex",
        lambda url: {
            "base_url": url + "/v1",
            "model": "gpt-test",
            "env": {"OPENAI_API_KEY": "k"},
            "extra_args": ["-c", "model_providers.phasegate.request_max_retries=0"],
        },
    ),
    "gemini": (
        "gemini",
        lambda url: {"base_url": url, "model": "gemini-2.5-flash", "env": {"GEMINI_API_KEY": "k"}},
    ),
    "opencode": (
        "opencode",
        lambda url: {
            "base_url": url + "/v1",
            "model": "scripted-model",
            "api_key_env": "PROBE_MODEL_KEY",
            "env": {"PROBE_MODEL_KEY": "k"},
        },
    ),
    "qwen": (
        "qwen",
        lambda url: {
            "base_url": url + "/v1",
            "model": "qwen3-coder-plus",
            "api_key_env": "PROBE_MODEL_KEY",
            "env": {"PROBE_MODEL_KEY": "k"},
        },
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("runner", sorted(MCP_PROGRAMS))
def test_the_bindings_mcp_server_is_started_by_the_program_and_its_tool_offered(
    tmp_path: Path, runner: str, server_factory
) -> None:
    cli, fields = MCP_PROGRAMS[runner]
    # Gemini CLI and Qwen Code start no MCP server in a workspace they do not trust, and
    # a read-only role's is not trusted (what the build wrote in .gemini/ or .qwen/ must
    # not configure it): their bindings' servers reach the build only (docs/agent-clis.md).
    read_only = runner not in ("gemini", "qwen")
    marker = REVIEW if read_only else BUILD
    server = server_factory({marker: [Step(text="Fine.\nVERDICT: approve")]})
    log = tmp_path / "probe.log"
    binding = RoleBinding(
        runner=runner,
        executable=agent_cli(cli),
        timeout=90.0,
        mcp_servers={"probe": _probe(log)},
        **fields(server.url),
    )
    repo = make_repo(tmp_path / "repo")
    request = _request(repo, read_only=read_only, prompt=f"{marker}: look")
    result = make_runner(binding, repo).run(request, threading.Event())

    assert result.ok, (result.error_kind, result.error)
    assert "VERDICT: approve" in result.text
    assert TOOL in _offered(server, marker)
    # started by the program, with the env the binding gave the server
    assert "started mark=from-the-binding" in log.read_text()
    assert git(repo, "status", "--porcelain") == ""


def test_doctor_shows_each_roles_profile_and_names_an_mcp_server_it_cannot_start(
    tmp_path: Path,
) -> None:
    repo = make_repo(tmp_path / "repo")
    tools = tmp_path / "tools"
    tools.mkdir()
    for program in ("claude", "docs-mcp", "gemini"):
        (tools / program).write_text("#!/bin/sh\necho 1.0\n")
        (tools / program).chmod(0o755)
    (repo / "phasegate.toml").write_text(
        "[agents.claude]\n"
        'runner = "claude-code"\n'
        'model = "model-fast"\n'
        'api_key_env = "PROFILE_KEY"\n'
        "[agents.claude.mcp_servers.docs]\n"
        'command = "docs-mcp"\n'
        "[agents.claude.mcp_servers.tracker]\n"
        'command = "no-such-mcp-server"\n'
        "[agents.gem]\n"
        'runner = "gemini"\n'
        'api_key_env = "PROFILE_KEY"\n'
        "[agents.gem.mcp_servers.docs]\n"
        'command = "docs-mcp"\n'
        "[roles]\n"
        'plan = "claude"\n'
        'build = "gem"\n'
        'review = "gem"\n'
        "[roles.plan_review]\n"
        'agent = "claude"\n'
        'model = "model-deep"\n'
        "[roles.verification]\n"
        'runner = "command"\n'
        'command = "echo VERDICT: confirmed"\n'
    )
    environ = {"PATH": f"{tools}:/usr/bin:/bin", "PROFILE_KEY": "k"}
    found = diagnose(
        repo, environ=environ, which=lambda name: shutil.which(name, path=environ["PATH"])
    )
    roles = {r.role: r for r in found.roles}
    assert (roles["plan"].agent, roles["plan"].model) == ("claude", "model-fast")
    assert (roles["plan_review"].agent, roles["plan_review"].model) == ("claude", "model-deep")
    assert roles["plan"].mcp_servers == {"docs": str(tools / "docs-mcp"), "tracker": None}
    assert (
        "roles.plan.mcp_servers.tracker.command (agent profile claude): "
        "`no-such-mcp-server` is not found" in found.missing
    )
    assert not found.ok
    # the gemini reviewer's servers would never start: said, not refused
    warned = "\n".join(found.warnings)
    assert "roles.review.mcp_servers: Gemini CLI starts no MCP server" in warned
    assert "roles.build.mcp_servers" not in warned


OTHER_ROLES = ("plan_review", "build", "review", "verification")


def test_doctor_on_a_role_naming_no_profile_says_so_once_and_reads_the_other_roles(
    tmp_path: Path,
) -> None:
    # Before: every role of an invalid cartridge read without its profile ("runner:
    # Field required", five times), and the bad reference said twice.
    repo = make_repo(tmp_path / "repo")
    (repo / "phasegate.toml").write_text(
        '[agents.fast]\nrunner = "claude-code"\nmodel = "m"\n'
        '[roles.plan]\nagent = "nope"\n'
        + "".join(f'[roles.{r}]\nagent = "fast"\n' for r in OTHER_ROLES)
    )
    found = diagnose(repo, environ={"PATH": "/usr/bin:/bin"}, which=lambda name: None)
    roles = {r.role: r for r in found.roles}
    said = "roles.plan.agent: no agent profile 'nope' (profiles: fast)"
    assert roles["plan"].error is not None and roles["plan"].error.startswith(said)
    assert sum(said in problem for problem in found.missing) == 1
    assert all((roles[r].agent, roles[r].model) == ("fast", "m") for r in OTHER_ROLES)
    assert not any("Field required" in problem for problem in found.missing)
