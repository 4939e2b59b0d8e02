"""Agents: the Runner protocol and the runners phasegate ships."""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from phasegate.agents.base import ERROR_KINDS, AgentRequest, AgentResult, Runner
from phasegate.agents.runners.aider import AiderRunner
from phasegate.agents.runners.claude_code import ClaudeCodeRunner
from phasegate.agents.runners.codex import CodexRunner
from phasegate.agents.runners.command import CommandRunner
from phasegate.agents.runners.copilot import CopilotRunner
from phasegate.agents.runners.gemini import GeminiRunner
from phasegate.agents.runners.mini_swe_agent import MiniSweAgentRunner
from phasegate.agents.runners.opencode import OpencodeRunner
from phasegate.agents.runners.qwen import QwenRunner
from phasegate.agents.runners.scripted import ScriptedRunner
from phasegate.config.agents import AGENT_PROGRAMS
from phasegate.config.cartridge import RoleBinding

__all__ = [
    "ERROR_KINDS",
    "AiderRunner",
    "AgentRequest",
    "AgentResult",
    "ClaudeCodeRunner",
    "CodexRunner",
    "CommandRunner",
    "CopilotRunner",
    "GeminiRunner",
    "MiniSweAgentRunner",
    "OpencodeRunner",
    "QwenRunner",
    "DEFAULT_EXECUTABLES",
    "Runner",
    "binding_problems",
    "ScriptedRunner",
    "make_runner",
]


#: The program each CLI runner starts when its binding names no ``executable``.
DEFAULT_EXECUTABLES = {runner: program.executable for runner, program in AGENT_PROGRAMS.items()}


def binding_problems(
    role: str, binding: RoleBinding, environ: Mapping[str, str] | None = None
) -> list[str]:
    """What would make every call of ``role`` fail, each naming its cartridge key:
    a CLI that is not there, a key variable that is not set, litellm missing."""
    source = os.environ if environ is None else environ
    problems = []
    exe = binding.executable or DEFAULT_EXECUTABLES.get(binding.runner)
    if exe and binding.runner in DEFAULT_EXECUTABLES and shutil.which(exe) is None:
        key = "executable" if binding.executable else "runner"
        problems.append(f"roles.{role}.{key}: the {binding.runner} program `{exe}` is not found")
    if (
        binding.api_key_env
        and binding.api_key_env not in source
        and binding.api_key_env not in binding.env
    ):
        problems.append(f"roles.{role}.api_key_env: ${binding.api_key_env} is not set")
    if binding.runner == "api" and importlib.util.find_spec("litellm") is None:
        problems.append(f"roles.{role}.runner: api needs litellm: pip install 'phasegate[api]'")
    return problems


def make_runner(binding: RoleBinding, repo: Path) -> Runner:
    """The runner a role binding names; relative script paths resolve against ``repo``."""
    if binding.runner == "command":
        return CommandRunner(binding)
    if binding.runner == "claude-code":
        return ClaudeCodeRunner(binding)
    if binding.runner == "codex":
        return CodexRunner(binding)
    if binding.runner == "api":
        from phasegate.agents.runners.api import ApiRunner  # litellm is heavy: import it when bound

        return ApiRunner(binding)
    if binding.runner == "mini-swe-agent":
        return MiniSweAgentRunner(binding)
    if binding.runner == "aider":
        return AiderRunner(binding)
    if binding.runner == "gemini":
        return GeminiRunner(binding)
    if binding.runner == "opencode":
        return OpencodeRunner(binding)
    if binding.runner == "qwen":
        return QwenRunner(binding)
    if binding.runner == "copilot":
        return CopilotRunner(binding)
    assert binding.script is not None
    script = Path(binding.script)
    return ScriptedRunner.from_file(script if script.is_absolute() else repo / script)
