"""A binding's MCP servers (``mcp_servers``) in each program's own terms.

Every program that takes MCP servers reads them from a configuration of its own;
phasegate writes them there, per call, and never merges in the person's own
(each runner's HOME or config dir is the workflow's):

- Claude Code: ``--mcp-config FILE --strict-mcp-config``, the file
  ``{"mcpServers": {name: {"type": "stdio", "command", "args", "env"} |
  {"type": "http", "url"}}}``; its MCP tools are ``mcp__<name>__<tool>``, allowed
  by the rule ``mcp__<name>``; ``MCP_CONNECTION_NONBLOCKING=0`` (its ``-p`` mode
  otherwise sends the first request before a slow server has connected);
- Codex: ``[mcp_servers.<name>]`` tables in ``CODEX_HOME/config.toml``
  (``command``, ``args``, ``env`` or ``url``; ``required``, so that its first
  turn waits for them, and eager start-up: 0.171 otherwise starts a server only
  when its model searches for the server's tools, and offers them under the
  namespace ``mcp__<name>``);
- Gemini CLI and Qwen Code: ``mcpServers`` in ``HOME/.gemini/settings.json`` (``.qwen``)
  (``command``, ``args``, ``env`` or ``httpUrl``), each ``trust``-ed: a run
  without a person cannot confirm a call, and the cartridge's binding is the
  person's consent (as Claude Code's ``mcp__<name>`` rule is, for every role;
  what a read-only role's server changes in the checkout is undone all the same);
- opencode: ``mcp`` in its inline config (``{"type": "local", "command": [cmd,
  *args], "environment"}`` or ``{"type": "remote", "url"}``); its tools are
  ``<name>_<tool>``, which a read-only role's permission allows.

Gemini CLI 0.61 and Qwen Code 0.24 start no MCP server in a workspace they do
not trust, and a read-only role's workspace is not trusted
(``phasegate.agents.runners.gemini_family``): a gemini or qwen binding's servers reach
its build role only. Qwen Code's servers are also ``alwaysLoadTools`` (else
their tools hide behind its ``tool_search``) and ``QWEN_CODE_LEGACY_MCP_BLOCKING``
makes its first request wait for them.

A server's ``env`` goes to the server only, as the cartridge writes it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from phasegate.config.cartridge import McpServer

__all__ = [
    "claude_allowed_tools",
    "claude_config",
    "codex_toml",
    "gemini_servers",
    "opencode_servers",
]


def claude_config(servers: Mapping[str, McpServer]) -> dict[str, Any]:
    """Claude Code's ``--mcp-config`` document for ``servers``."""
    entries: dict[str, Any] = {}
    for name, server in servers.items():
        if server.url is not None:
            entries[name] = {"type": "http", "url": server.url}
        else:
            entries[name] = {
                "type": "stdio",
                "command": server.command,
                "args": list(server.args),
                "env": dict(server.env),
            }
    return {"mcpServers": entries}


def claude_allowed_tools(servers: Mapping[str, McpServer]) -> list[str]:
    """The ``--allowedTools`` rules that let Claude Code call every tool of ``servers``."""
    return [f"mcp__{name}" for name in servers]


def _toml(value: Any) -> str:
    # JSON's strings, lists and flat objects of strings are TOML's basic strings,
    # arrays and (as inline tables, written below) tables.
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def codex_toml(servers: Mapping[str, McpServer]) -> list[str]:
    """The lines of Codex's ``config.toml`` that declare ``servers`` (tables, so
    they go after every top-level key)."""
    if not servers:
        return []
    # Codex 0.171 starts a stdio server only once its model searches for its tools
    # (a `tool_search` that a model behind another provider may never call): started
    # with the call, its tools are offered to the model as they are.
    lines = ["", "[features]", "mcp_lazy_stdio_startup = false"]
    for name, server in servers.items():
        # required: the turn waits for it to start (else its tools may come too late).
        lines += ["", f"[mcp_servers.{json.dumps(name)}]", "required = true"]
        if server.url is not None:
            lines.append(f"url = {_toml(server.url)}")
            continue
        lines.append(f"command = {_toml(server.command)}")
        lines.append(f"args = {_toml(list(server.args))}")
        if server.env:
            lines.append(f"env = {_toml(dict(server.env))}")
    return lines


def gemini_servers(servers: Mapping[str, McpServer]) -> dict[str, Any]:
    """Gemini CLI's (and Qwen Code's) ``mcpServers`` setting for ``servers``, each
    trusted (its tools' calls need no confirmation)."""
    entries: dict[str, Any] = {}
    for name, server in servers.items():
        if server.url is not None:
            entry: dict[str, Any] = {"httpUrl": server.url}
        else:
            entry = {"command": server.command, "args": list(server.args)}
            if server.env:
                entry["env"] = dict(server.env)
        entries[name] = {**entry, "trust": True}
    return entries


def opencode_servers(servers: Mapping[str, McpServer]) -> dict[str, Any]:
    """opencode's ``mcp`` config for ``servers``."""
    entries: dict[str, Any] = {}
    for name, server in servers.items():
        if server.url is not None:
            entries[name] = {"type": "remote", "url": server.url, "enabled": True}
        else:
            entries[name] = {
                "type": "local",
                "command": [server.command, *server.args],
                "environment": dict(server.env),
                "enabled": True,
            }
    return entries
