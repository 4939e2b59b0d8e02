"""Agents: the Runner protocol and the runners phasegate ships."""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phasegate.config.agents import AGENT_PROGRAMS

if TYPE_CHECKING:
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
    from phasegate.config.cartridge import RoleBinding

#: Where each re-exported name lives. It loads on first use (``__getattr__``), so
#: asking whether a binding can run (``binding_problems``) imports no runner.
_HOMES = {
    "ERROR_KINDS": "phasegate.agents.base",
    "AgentRequest": "phasegate.agents.base",
    "AgentResult": "phasegate.agents.base",
    "Runner": "phasegate.agents.base",
    "AiderRunner": "phasegate.agents.runners.aider",
    "ClaudeCodeRunner": "phasegate.agents.runners.claude_code",
    "CodexRunner": "phasegate.agents.runners.codex",
    "CommandRunner": "phasegate.agents.runners.command",
    "CopilotRunner": "phasegate.agents.runners.copilot",
    "GeminiRunner": "phasegate.agents.runners.gemini",
    "MiniSweAgentRunner": "phasegate.agents.runners.mini_swe_agent",
    "OpencodeRunner": "phasegate.agents.runners.opencode",
    "QwenRunner": "phasegate.agents.runners.qwen",
    "ScriptedRunner": "phasegate.agents.runners.scripted",
}

#: The runner class each ``runner`` of a binding names (``api`` and ``scripted`` aside).
_RUNNER_CLASSES = {
    "command": "CommandRunner",
    "claude-code": "ClaudeCodeRunner",
    "codex": "CodexRunner",
    "mini-swe-agent": "MiniSweAgentRunner",
    "aider": "AiderRunner",
    "gemini": "GeminiRunner",
    "opencode": "OpencodeRunner",
    "qwen": "QwenRunner",
    "copilot": "CopilotRunner",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


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
    if binding.runner == "api":
        from phasegate.agents.runners.api import ApiRunner  # litellm is heavy: import it when bound

        return ApiRunner(binding)
    runner_class = _RUNNER_CLASSES.get(binding.runner)
    if runner_class is not None:
        runner: Runner = __getattr__(runner_class)(binding)
        return runner
    assert binding.script is not None
    script = Path(binding.script)
    scripted: type[ScriptedRunner] = __getattr__("ScriptedRunner")
    return scripted.from_file(script if script.is_absolute() else repo / script)
