"""Gemini's generateContent API, for ``ScriptedModelServer`` (Gemini CLI, Qwen Code's Gemini mode).

The Gemini API (``@google/genai``, which Gemini CLI uses with
``GOOGLE_GEMINI_BASE_URL``) calls

- ``POST /v1beta/models/MODEL:generateContent``: one ``GenerateContentResponse``;
- ``POST /v1beta/models/MODEL:streamGenerateContent?alt=sse``: SSE, one
  ``GenerateContentResponse`` a ``data:`` line, the last with ``finishReason``
  and ``usageMetadata``;
- ``POST /v1beta/models/MODEL:countTokens``: ``{"totalTokens": N}``.

A request holds ``contents``: turns with ``role`` ``user`` or ``model``, each a
list of ``parts`` (``text``, ``functionCall {name, args}``, ``functionResponse
{name, response}``). A tool call is a ``functionCall`` part of a ``model`` turn;
its result comes back as a ``functionResponse`` part of a ``user`` turn, which
is no new prompt. An error is ``{"error": {"code", "message", "status"}}``.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = [
    "count_tokens",
    "cwd",
    "error_payload",
    "is_count_tokens",
    "is_gemini",
    "is_stream",
    "model_of",
    "prompt_and_turns",
    "reply",
    "response",
    "stream_chunks",
]

_CALL = re.compile(r"/models/([^/:]+):(generateContent|streamGenerateContent|countTokens)$")

_STATUS = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND"}
_STATUS |= {429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE"}


def is_gemini(path: str) -> bool:
    """Whether ``path`` (no query) is a generateContent or streamGenerateContent call."""
    match = _CALL.search(path)
    return match is not None and match.group(2) != "countTokens"


def is_count_tokens(path: str) -> bool:
    match = _CALL.search(path)
    return match is not None and match.group(2) == "countTokens"


def is_stream(path: str) -> bool:
    return path.endswith(":streamGenerateContent")


def model_of(path: str) -> str:
    match = _CALL.search(path)
    return match.group(1) if match else ""


def count_tokens() -> dict[str, Any]:
    return {"totalTokens": 100}


def _parts(content: Any) -> list[Mapping[str, Any]]:
    parts = content.get("parts", []) if isinstance(content, Mapping) else []
    return [p for p in parts if isinstance(p, Mapping)]


def prompt_and_turns(body: Mapping[str, Any]) -> tuple[str, int]:
    """The latest prompt (the text parts of the last ``user`` turn that is not only
    function responses) and the ``model`` turns since."""
    prompt, turns = "", 0
    for content in body.get("contents", []):
        if not isinstance(content, Mapping):
            continue
        parts = _parts(content)
        if content.get("role", "user") == "user":
            texts = [str(p["text"]) for p in parts if "text" in p]
            if texts and not any("functionResponse" in p for p in parts):
                prompt, turns = "\n".join(texts), 0
        elif content.get("role") == "model":
            turns += 1
    return prompt, turns


_WORKSPACE = re.compile(r"Workspace Directories:\*\*\s*\n\s*- (\S+)")


def cwd(body: Mapping[str, Any]) -> str:
    """The working directory Gemini CLI names in its session context
    (``- **Workspace Directories:**`` then ``  - DIR``), or ""."""
    for content in body.get("contents", []):
        for part in _parts(content):
            match = _WORKSPACE.search(str(part.get("text", "")))
            if match:
                return match.group(1)
    return ""


def error_payload(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": _STATUS.get(status, "UNKNOWN")}}


def _usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "promptTokenCount": input_tokens,
        "candidatesTokenCount": output_tokens,
        "totalTokenCount": input_tokens + output_tokens,
    }


def _call_parts(tools: Sequence[Any]) -> list[dict[str, Any]]:
    return [
        {"functionCall": {"id": f"call_{uuid.uuid4().hex[:12]}", "name": t.name, "args": t.input}}
        for t in tools
    ]


def _candidate(parts: list[dict[str, Any]], finish: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finish:
        candidate["finishReason"] = "STOP"
    return candidate


def response(
    text: str, tools: Sequence[Any], model: str, input_tokens: int, output_tokens: int
) -> dict[str, Any]:
    """One ``GenerateContentResponse``: ``text`` and a ``functionCall`` part per tool
    (``.name``, ``.input``), ``finishReason: STOP`` and the usage."""
    parts = ([{"text": text}] if text else []) + _call_parts(tools)
    return {
        "candidates": [_candidate(parts, finish=True)],
        "usageMetadata": _usage(input_tokens, output_tokens),
        "modelVersion": model,
        "responseId": uuid.uuid4().hex[:20],
    }


def stream_chunks(
    text: str, tools: Sequence[Any], model: str, input_tokens: int, output_tokens: int
) -> Iterator[dict[str, Any]]:
    """The chunks of a streamed answer: the text, then the function calls with
    ``finishReason`` and ``usageMetadata`` (as the API sends them, usage last)."""
    response_id = uuid.uuid4().hex[:20]
    base = {"modelVersion": model, "responseId": response_id}
    calls = _call_parts(tools)
    if text and calls:
        yield {"candidates": [_candidate([{"text": text}], finish=False)], **base}
    yield {
        "candidates": [_candidate(calls or [{"text": text}], finish=True)],
        "usageMetadata": _usage(input_tokens, output_tokens),
        **base,
    }


def reply(path: str, step: Any, tools: Sequence[Any]) -> tuple[bool, Any]:
    """The answer to a call of ``path`` playing ``step`` (a ``Step``) with ``tools``
    (its calls, filled): ``(True, chunks)`` for a stream, else ``(False, response)``."""
    answer = (step.text, tools, model_of(path), step.input_tokens, step.output_tokens)
    if is_stream(path):
        return True, stream_chunks(*answer)
    return False, response(*answer)
