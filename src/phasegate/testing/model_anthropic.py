"""Anthropic's Messages API, for ``ScriptedModelServer`` (Claude Code).

``POST /v1/messages``: one message (``content`` blocks ``text`` and
``tool_use``, ``stop_reason`` ``tool_use`` or ``end_turn``, ``usage``); with
``"stream": true`` server-sent events: ``message_start``, per content block
``content_block_start``, ``content_block_delta`` (``text_delta`` or
``input_json_delta`` with the input as JSON) and ``content_block_stop``, then
``message_delta`` (the stop reason, the output tokens) and ``message_stop``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = ["reply"]


def reply(
    step: Any, tools: Sequence[Any], body: Mapping[str, Any], default_model: str, stream: bool
) -> tuple[bool, Any]:
    """The answer to a Messages request playing ``step`` (its text, usage) with
    ``tools`` (``ToolCall``: name, input): ``(False, message)``, or ``(True,
    events)`` for a streamed request, ``events`` yielding ``(event name, data)``."""
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    model = body.get("model", default_model)
    stop_reason = "tool_use" if tools else "end_turn"
    blocks: list[dict[str, Any]] = []
    if step.text:
        blocks.append({"type": "text", "text": step.text})
    for tool in tools:
        blocks.append(
            {
                "type": "tool_use",
                "id": f"toolu_{uuid.uuid4().hex[:24]}",
                "name": tool.name,
                "input": dict(tool.input),
            }
        )
    usage = {
        "input_tokens": step.input_tokens,
        "output_tokens": step.output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    if not stream:
        return False, {
            "id": message_id,
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": blocks,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }

    def events() -> Iterator[tuple[str | None, Any]]:
        yield (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {**usage, "output_tokens": 1},
                },
            },
        )
        for i, block in enumerate(blocks):
            if block["type"] == "text":
                yield (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": i,
                        "content_block": {"type": "text", "text": ""},
                    },
                )
                yield (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {"type": "text_delta", "text": block["text"]},
                    },
                )
            else:
                yield (
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": i,
                        "content_block": {**block, "input": {}},
                    },
                )
                yield (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": i,
                        "delta": {
                            "type": "input_json_delta",
                            "partial_json": json.dumps(block["input"]),
                        },
                    },
                )
            yield "content_block_stop", {"type": "content_block_stop", "index": i}
        yield (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": step.output_tokens},
            },
        )
        yield "message_stop", {"type": "message_stop"}

    return True, events()
