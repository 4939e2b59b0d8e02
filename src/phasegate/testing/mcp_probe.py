"""A tiny MCP server for tests: ``python -m phasegate.testing.mcp_probe [LOG]``.

It speaks MCP's stdio transport (JSON-RPC 2.0, one message a line, on stdin
and stdout) and offers one tool, ``probe_echo(text)``, that answers its text
back. Given a ``LOG`` path, it appends ``started mark=<PHASEGATE_PROBE_MARK>``
there when a program starts it (the mark is what a binding's
``mcp_servers.<name>.env`` gave it) and ``called <text>`` for each call, so a
test sees that the program it was configured for really ran it.

Written on the standard library, not on the ``mcp`` SDK: a program lists a
server's tools for its first model request only if the server has answered by
then, and the SDK's import alone takes seconds on a loaded two-core machine.
It answers ``initialize``, ``ping``, ``tools/list`` and ``tools/call``;
notifications are read and ignored; any other request gets "method not found".
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["TOOL", "answer", "main"]

#: The probe's one tool.
TOOL = "probe_echo"

_TOOLS = [
    {
        "name": TOOL,
        "description": "Answer the text back.",
        "inputSchema": {
            "type": "object",
            "properties": {"text": {"type": "string"}},
            "required": ["text"],
        },
    }
]


def _log(path: Path | None, line: str) -> None:
    if path is not None:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def answer(message: dict[str, Any], log: Path | None = None) -> dict[str, Any] | None:
    """The JSON-RPC response to ``message``, or None for a notification."""
    if "id" not in message:
        return None
    method, params = message.get("method"), message.get("params") or {}
    if method == "initialize":
        result: dict[str, Any] = {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {"name": "phasegate-probe", "version": "1"},
        }
    elif method == "ping":
        result = {}
    elif method == "tools/list":
        result = {"tools": _TOOLS}
    elif method == "tools/call" and params.get("name") == TOOL:
        text = str((params.get("arguments") or {}).get("text", ""))
        _log(log, f"called {text}")
        result = {"content": [{"type": "text", "text": text}], "isError": False}
    else:
        error = {"code": -32601, "message": f"method not found: {method}"}
        return {"jsonrpc": "2.0", "id": message["id"], "error": error}
    return {"jsonrpc": "2.0", "id": message["id"], "result": result}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    log = Path(args[0]) if args else None
    _log(log, f"started mark={os.environ.get('PHASEGATE_PROBE_MARK', '')}")
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            continue
        reply = answer(message, log) if isinstance(message, dict) else None
        if reply is not None:
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
