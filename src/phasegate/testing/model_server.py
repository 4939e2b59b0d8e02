"""A scripted model server: real agent CLIs, offline, against scripted model turns.

It speaks the three wire formats the agent CLIs use (docs/agent-clis.md):

- Anthropic Messages (``POST /v1/messages``), streaming SSE or plain JSON:
  Claude Code;
- OpenAI Responses (``POST /v1/responses``), streaming SSE: Codex CLI;
- OpenAI chat completions (``POST /v1/chat/completions``), plain JSON or
  SSE chunks ending in ``[DONE]``: litellm, aider, mini-swe-agent;
- Gemini ``generateContent``/``streamGenerateContent`` (``model_gemini``): Gemini CLI.

A script is a list of ``Step`` s, chosen by a marker: the first script whose
marker occurs in the request's latest prompt (or ``"*"``) plays. The server
keeps no state between requests: the step to play is the number of assistant
turns since that prompt, so a tool loop walks its script, a resumed session's
new prompt starts its own script while still carrying the earlier rounds'
turns, and a retried request gets the same answer.

Every request is recorded (``requests``) with its parsed body, so a test can
see what a CLI sent, e.g. that a second review round carried the first
round's turns. Headers that carry keys are recorded with their values masked.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from phasegate.testing import model_anthropic, model_gemini

__all__ = ["Recorded", "ScriptedModelServer", "Step", "ToolCall", "key_sha"]


def key_sha(key: str) -> str:
    """The fingerprint ``Recorded.key_sha`` holds for ``key``."""
    return hashlib.sha256(key.encode()).hexdigest()[:12]


_SECRET_HEADERS = ("x-api-key", "authorization", "api-key", "x-goog-api-key")


@dataclass(frozen=True)
class ToolCall:
    """A tool the model asks for. ``{cwd}`` in string inputs becomes the agent's
    working directory (read from Claude Code's system prompt)."""

    name: str
    input: Mapping[str, Any]


@dataclass(frozen=True)
class Step:
    """One assistant turn.

    - ``text``: the answer text (may be empty when the turn only calls tools);
    - ``tools``: tool calls; a turn with tools stops with ``tool_use``;
    - ``status``: an HTTP status other than 200 answers with an error body;
    - ``input_tokens``/``output_tokens``: the usage reported (a CLI computes
      its cost from these, so large numbers drive a budget stop);
    - ``delay_s``: seconds to wait before answering (``hang`` waits ~forever).
    """

    text: str = ""
    tools: tuple[ToolCall, ...] = ()
    status: int = 200
    input_tokens: int = 100
    output_tokens: int = 20
    delay_s: float = 0.0
    hang: bool = False


@dataclass
class Recorded:
    """One request as the server saw it. Key headers are masked; ``key_sha``
    is the first 12 hex digits of the key's SHA-256, so a test can tell which
    key a process held without the key being kept anywhere."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    key_sha: str | None = None
    script: str | None = None
    step: int | None = None


@dataclass
class _Script:
    marker: str
    steps: Sequence[Step]


def _texts(content: Any, kind: str) -> list[str]:
    """The text blocks of a message's content (Claude Code's system reminders left out)."""
    if isinstance(content, str):
        return [content]
    texts = [c.get("text", "") for c in content if isinstance(c, dict) and c.get("type") == kind]
    return [t for t in texts if not t.startswith("<system-reminder>")]


def _prompt_and_turns(api: str, body: Mapping[str, Any]) -> tuple[str, int]:
    """The latest prompt a person (or phasegate) wrote, and the assistant turns since.

    Tool results are not prompts, so a tool loop keeps its prompt; a resumed
    session's new prompt starts its script afresh while the request still
    carries the earlier rounds' turns.
    """
    if api == "gemini":
        return model_gemini.prompt_and_turns(body)
    if api == "responses":
        items = body.get("input", [])
        if isinstance(items, str):
            return items, 0
        prompt, turns, in_calls = "", 0, False
        for item in items:
            kind = item.get("type", "message")
            if kind == "message" and item.get("role") == "user":
                texts = _texts(item.get("content", []), "input_text")
                if texts:
                    prompt, turns, in_calls = "\n".join(texts), 0, False
                    continue
            if kind == "function_call":
                # Each earlier turn that called tools comes back as its function_call items.
                if not in_calls:
                    turns, in_calls = turns + 1, True
            elif kind != "function_call_output":
                in_calls = False
                if kind == "message" and item.get("role") == "assistant":
                    turns += 1
        return prompt, turns
    prompt, turns = "", 0
    for message in body.get("messages", []):
        role = message.get("role")
        if role == "user":
            texts = _texts(message.get("content", ""), "text")
            if texts:
                prompt, turns = "\n".join(texts), 0
        elif role == "assistant":
            turns += 1
    return prompt, turns


def _cwd(body: Mapping[str, Any]) -> str:
    """The agent's working directory: Claude Code says it in its system prompt,
    Qwen Code in the context it sends as its first chat message."""
    system = body.get("system", "")
    if isinstance(system, list):
        system = "\n".join(s.get("text", "") for s in system if isinstance(s, dict))
    match = re.search(r"Primary working directory: (\S+)", str(system))
    if match:
        return match.group(1)
    first: Mapping[str, Any] = next(
        (m for m in body.get("messages", []) if m.get("role") == "user"), {}
    )
    content = first.get("content", "")
    texts = (
        [content]
        if isinstance(content, str)
        else [c.get("text", "") for c in content if isinstance(c, dict)]
    )
    match = re.search(r"I'm currently working in the directory: (\S+)", "\n".join(texts))
    return match.group(1) if match else ""


def _fill(value: Any, cwd: str) -> Any:
    if isinstance(value, str):
        return value.replace("{cwd}", cwd)
    if isinstance(value, Mapping):
        return {k: _fill(v, cwd) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_fill(v, cwd) for v in value]
    return value


class ScriptedModelServer:
    """A local HTTP model endpoint playing scripted steps. Use as a context manager.

    ``scripts`` maps a marker to its steps; ``"*"`` matches any request.
    ``url`` is ``http://127.0.0.1:PORT`` (no ``/v1``).
    """

    def __init__(self, scripts: Mapping[str, Sequence[Step]], model: str = "scripted-model"):
        self.scripts = [_Script(marker, steps) for marker, steps in scripts.items()]
        self.model = model
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet: tests read .requests
                pass

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:  # noqa: N802
                body = json.dumps({"data": [{"id": server.model, "object": "model"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"_raw": raw.decode(errors="replace")}
                server._handle(self, body)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    # -- lifecycle ----------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        assert isinstance(host, str)  # an AF_INET server's host is text, never bytes
        return f"http://{host}:{port}"

    def start(self) -> ScriptedModelServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> ScriptedModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what was asked -------------------------------------------------------------

    def played(self, marker: str) -> list[Recorded]:
        """The recorded requests that played the script of ``marker``."""
        with self._lock:
            return [r for r in self.requests if r.script == marker]

    # -- answering ----------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler, body: Any) -> None:
        path = handler.path.split("?")[0]
        if path.endswith("/messages/count_tokens"):
            return self._json(handler, 200, {"input_tokens": 100})
        if model_gemini.is_count_tokens(path):
            return self._json(handler, 200, model_gemini.count_tokens())
        api = (
            "anthropic"
            if path.endswith("/messages")
            else "responses"
            if path.endswith("/responses")
            else "chat"
            if path.endswith("/chat/completions")
            else "gemini"
            if model_gemini.is_gemini(path)
            else None
        )
        headers = {
            k.lower(): ("***" if k.lower() in _SECRET_HEADERS else v)
            for k, v in handler.headers.items()
        }
        key = (
            handler.headers.get("x-api-key")
            or handler.headers.get("api-key")
            or handler.headers.get("x-goog-api-key")
            or (handler.headers.get("authorization", "").removeprefix("Bearer ").strip())
        )
        record = Recorded("POST", handler.path, headers, body, key_sha(key) if key else None)
        with self._lock:
            self.requests.append(record)
        if api is None or not isinstance(body, dict):
            return self._json(handler, 404, {"error": {"message": f"no such endpoint {path}"}})
        text, index = _prompt_and_turns(api, body)
        script = next((s for s in self.scripts if s.marker == "*" or s.marker in text), None)
        if script is None:
            return self._error(handler, api, 400, f"no script matches this request: {text[:200]!r}")
        record.script, record.step = script.marker, index
        if index >= len(script.steps):
            return self._error(handler, api, 400, f"script {script.marker!r} has no step {index}")
        step = script.steps[index]
        if step.hang:
            self._stop.wait(3600)
            return None
        if step.delay_s:
            self._stop.wait(step.delay_s)
        if step.status != 200:
            return self._error(handler, api, step.status, "scripted server error")
        cwd = model_gemini.cwd(body) if api == "gemini" else _cwd(body)
        tools = tuple(ToolCall(t.name, _fill(dict(t.input), cwd)) for t in step.tools)
        stream = bool(body.get("stream"))
        if api == "gemini":
            streamed, reply = model_gemini.reply(path, step, tools)
            if streamed:
                return self._sse(handler, ((None, chunk) for chunk in reply))
            return self._json(handler, 200, reply)
        if api == "anthropic":
            streamed, reply = model_anthropic.reply(step, tools, body, self.model, stream)
            if streamed:
                return self._sse(handler, reply)
            return self._json(handler, 200, reply)
        if api == "responses":
            return self._responses(handler, step, tools, body)
        return self._chat(handler, step, tools, stream)

    # -- wire formats -------------------------------------------------------------

    def _json(self, handler: BaseHTTPRequestHandler, status: int, payload: Any) -> None:
        data = json.dumps(payload).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(data)
        handler.close_connection = True

    def _error(
        self, handler: BaseHTTPRequestHandler, api: str | None, status: int, msg: str
    ) -> None:
        if api == "anthropic":
            kind = "api_error" if status >= 500 else "invalid_request_error"
            payload: dict[str, Any] = {"type": "error", "error": {"type": kind, "message": msg}}
        elif api == "gemini":
            payload = model_gemini.error_payload(status, msg)
        else:
            payload = {"error": {"message": msg, "type": "server_error", "code": status}}
        self._json(handler, status, payload)

    def _sse(
        self, handler: BaseHTTPRequestHandler, events: Iterator[tuple[str | None, Any]]
    ) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Connection", "close")
        handler.end_headers()
        for name, data in events:
            chunk = (
                f"event: {name}\n" if name else ""
            ) + f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
            handler.wfile.write(chunk.encode())
            handler.wfile.flush()
        handler.close_connection = True

    def _responses(
        self,
        handler: BaseHTTPRequestHandler,
        step: Step,
        tools: tuple[ToolCall, ...],
        body: Mapping[str, Any],
    ) -> None:
        response_id = f"resp_{uuid.uuid4().hex[:24]}"
        model = body.get("model", self.model)
        items: list[dict[str, Any]] = []
        if step.text:
            items.append(
                {
                    "type": "message",
                    "id": f"msg_{uuid.uuid4().hex[:16]}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": step.text, "annotations": []}],
                }
            )
        for tool in tools:
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_{uuid.uuid4().hex[:16]}",
                    "call_id": f"call_{uuid.uuid4().hex[:16]}",
                    "name": tool.name,
                    "arguments": json.dumps(dict(tool.input)),
                    "status": "completed",
                }
            )
        usage = {
            "input_tokens": step.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": step.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": step.input_tokens + step.output_tokens,
        }
        base = {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()),
            "model": model,
        }

        def events() -> Iterator[tuple[str | None, Any]]:
            seq = iter(range(10_000))
            yield (
                "response.created",
                {
                    "type": "response.created",
                    "sequence_number": next(seq),
                    "response": {**base, "status": "in_progress", "output": []},
                },
            )
            for i, item in enumerate(items):
                start = {**item, "status": "in_progress"}
                if item["type"] == "message":
                    start["content"] = []
                else:
                    start["arguments"] = ""
                yield (
                    "response.output_item.added",
                    {
                        "type": "response.output_item.added",
                        "sequence_number": next(seq),
                        "output_index": i,
                        "item": start,
                    },
                )
                if item["type"] == "message":
                    yield (
                        "response.output_text.delta",
                        {
                            "type": "response.output_text.delta",
                            "sequence_number": next(seq),
                            "item_id": item["id"],
                            "output_index": i,
                            "content_index": 0,
                            "delta": item["content"][0]["text"],
                        },
                    )
                else:
                    yield (
                        "response.function_call_arguments.delta",
                        {
                            "type": "response.function_call_arguments.delta",
                            "sequence_number": next(seq),
                            "item_id": item["id"],
                            "output_index": i,
                            "delta": item["arguments"],
                        },
                    )
                yield (
                    "response.output_item.done",
                    {
                        "type": "response.output_item.done",
                        "sequence_number": next(seq),
                        "output_index": i,
                        "item": item,
                    },
                )
            yield (
                "response.completed",
                {
                    "type": "response.completed",
                    "sequence_number": next(seq),
                    "response": {**base, "status": "completed", "output": items, "usage": usage},
                },
            )

        self._sse(handler, events())

    def _chat(
        self,
        handler: BaseHTTPRequestHandler,
        step: Step,
        tools: tuple[ToolCall, ...],
        stream: bool,
    ) -> None:
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        calls = [
            {
                "id": f"call_{uuid.uuid4().hex[:16]}",
                "type": "function",
                "function": {"name": t.name, "arguments": json.dumps(dict(t.input))},
            }
            for t in tools
        ]
        message: dict[str, Any] = {"role": "assistant", "content": step.text or None}
        if calls:
            message["tool_calls"] = calls
        finish = "tool_calls" if calls else "stop"
        usage = {
            "prompt_tokens": step.input_tokens,
            "completion_tokens": step.output_tokens,
            "total_tokens": step.input_tokens + step.output_tokens,
        }
        created = int(time.time())
        if not stream:
            return self._json(
                handler,
                200,
                {
                    "id": completion_id,
                    "object": "chat.completion",
                    "created": created,
                    "model": self.model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                },
            )

        def events() -> Iterator[tuple[str | None, Any]]:
            chunk = {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": self.model,
            }
            delta: dict[str, Any] = {"role": "assistant", "content": step.text or ""}
            if calls:
                delta["tool_calls"] = [{**c, "index": i} for i, c in enumerate(calls)]
            yield None, {**chunk, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
            yield (
                None,
                {
                    **chunk,
                    "choices": [{"index": 0, "delta": {}, "finish_reason": finish}],
                    "usage": usage,
                },
            )
            yield None, "[DONE]"

        self._sse(handler, events())
        return None
