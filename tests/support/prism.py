"""GitHub's own schema as the referee of phasegate's GitHub traffic in tests.

``PrismProxy`` runs Stoplight Prism (``@stoplight/prism-cli``) as a
validating proxy over GitHub's official OpenAPI description
(``@octokit/openapi``), cut by ``cut_description`` to the operations phasegate
uses (``OPERATIONS``). Point phasegate's forge at
``PrismProxy.url`` instead of the fake GitHub server: Prism forwards each call
upstream and checks both directions against the description.

What Prism 5.16 does with ``--errors`` in proxy mode (read in its source,
each proved in ``tests/test_prism.py``):

- a request the description rejects (a required body field missing, a query
  value outside its enum or format, a content type it does not list) is
  **not forwarded**: 422 ``application/problem+json``, type
  ``UNPROCESSABLE_ENTITY``, its ``validation`` listing each violation;
- a forwarded response the description rejects (a required field missing, a
  wrong type or format -- ``uri``, ``date-time``, an int64 over 2**53 -- a
  2xx status the operation does not document, 204 included, a body that is
  not JSON where JSON is documented) becomes 500 ``application/problem+json``
  of type ``VIOLATIONS``; the upstream call has happened by then;
- a path or method outside the cut is refused, never forwarded: 404
  ``NO_PATH_MATCHED_ERROR`` / 405 ``NO_METHOD_MATCHED_ERROR``; so is a
  ``{ref}`` holding a raw ``/`` (send ``%2F``, which reaches upstream as is);
- a 4xx/5xx status the operation does not document (429, 500 on demand) is a
  **warning** only: it passes through unchanged, headers (``Retry-After``,
  ``x-ratelimit-*``) and body, with an ``sl-violations`` header added;
- an upstream **501** is answered with a mock Prism makes from the
  description's examples (a 2xx!): never script a 501;
- an upstream Prism cannot read (down, an empty body said to be JSON) is 500
  ``application/problem+json`` of type ``FetchError``;
- what passes is re-serialised: JSON bodies compact (same values, same key
  order), gzip undone, query values percent-encoded (``head=o%3Ab``),
  CORS headers added; ``Authorization``, ``Link``, ``Location`` pass as sent.

Prism logs a refused exchange as one line without its violations, so
``PrismProxy`` puts a recording relay in front of Prism: ``violations()``
lists each one, attributed to its request, and ``assert_clean()`` fails a
test on any, whatever status the client made of it.

The cut itself is ``support.github_openapi`` (standard library only,
so ``scripts/cut_openapi.py`` runs from a clean clone); this module makes it
once per description (``cached_cut``) and runs Prism over it.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from support import github_openapi
from support.github_openapi import OPERATIONS, cut_description, cut_file

__all__ = [
    "OPERATIONS",
    "Call",
    "PrismError",
    "PrismProxy",
    "Violation",
    "cached_cut",
    "cut_description",
    "find_description",
    "find_prism",
    "violations_of",
]

_NODE_MODULES = Path(__file__).resolve().parents[2] / ".ci" / "node" / "node_modules"
#: Where ``.ci/run`` installs GitHub's description (``@octokit/openapi``).
DEFAULT_SOURCE = _NODE_MODULES / "@octokit" / "openapi" / "generated" / "api.github.com.json"


class PrismError(RuntimeError):
    """Prism or GitHub's description is missing, or Prism did not start."""


# -- finding Prism and the description ----------------------------------------


def find_prism() -> str:
    """The ``prism`` executable: ``PHASEGATE_PRISM`` (which must exist: CI sets
    it), else the copy ``.ci/run`` installs under ``.ci/node``, else PATH.
    Raises ``PrismError`` saying how to install it."""
    named = os.environ.get("PHASEGATE_PRISM")
    if named:
        if not (Path(named).is_file() and os.access(named, os.X_OK)):
            raise PrismError(f"PHASEGATE_PRISM={named} is not an executable file")
        return named
    local = _NODE_MODULES / ".bin" / "prism"
    if local.is_file():
        return str(local)
    on_path = shutil.which("prism")
    if on_path:
        return on_path
    raise PrismError(
        "Prism is not installed: bash .ci/run installs @stoplight/prism-cli under .ci/node "
        "(npm install --prefix .ci/node @stoplight/prism-cli@5.16.0), or set PHASEGATE_PRISM"
    )


def find_description() -> Path:
    """GitHub's whole description: ``PHASEGATE_GITHUB_OPENAPI``, else the copy
    ``.ci/run`` installs (``DEFAULT_SOURCE``). Raises ``PrismError`` if missing."""
    source = Path(os.environ.get("PHASEGATE_GITHUB_OPENAPI") or DEFAULT_SOURCE)
    if not source.is_file():
        raise PrismError(
            f"GitHub's OpenAPI description is missing at {source}: bash .ci/run installs "
            "@octokit/openapi under .ci/node, or set PHASEGATE_GITHUB_OPENAPI"
        )
    return source


_cut_lock = threading.Lock()


def cached_cut(source: Path | None = None, cache_dir: Path | None = None) -> Path:
    """The cut of ``source`` (default ``find_description()``), made once and kept
    in ``cache_dir`` (default ``<tmp>/phasegate-prism``) under a name keyed by
    the SHA-256 of the source and of ``github_openapi.py`` (the cut and
    ``OPERATIONS``): a new description or a new cut makes a new file. Raises
    ``PrismError`` if the source is missing."""
    source = source or find_description()
    if not source.is_file():
        raise PrismError(f"no OpenAPI description at {source}")
    content = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    listed = hashlib.sha256(Path(github_openapi.__file__).read_bytes()).hexdigest()[:8]
    dest = (cache_dir or Path(tempfile.gettempdir()) / "phasegate-prism") / (
        f"github-{content}-{listed}.json"
    )
    with _cut_lock:
        if not dest.is_file():
            cut_file(source, dest)
    return dest


# -- the proxy ----------------------------------------------------------------

#: Prism's own problem types start with this; Prism's proxy failures (upstream
#: unreachable) are ``application/problem+json`` too, with type ``FetchError``.
PRISM_ERRORS = "https://stoplight.io/prism/errors#"
_UPSTREAM_501 = re.compile(r"Upstream call to (\S+) has returned 501")
_REMOCKED = "upstream answered 501 and Prism answered a mock of its own instead"
_HOP_BY_HOP = frozenset(
    ("connection", "keep-alive", "transfer-encoding", "content-length", "upgrade", "te")
)


@dataclass(frozen=True)
class Violation:
    """One thing GitHub's description does not allow, seen at the proxy.

    ``where`` is Prism's location, dotted: ``request.body.title``,
    ``request.query.state``, ``response.body.0.url``, ``response`` (a status
    the operation does not document), ``request`` (a route outside the cut, a
    content type), ``proxy`` (Prism could not judge: upstream unreadable, a
    501 it mocked); ``severity`` is ``error`` or ``warning``; ``status`` is
    what the client got (Prism's 422/404/405/500 for what it refused).
    """

    method: str
    target: str
    status: int
    severity: str
    where: str
    message: str

    def __str__(self) -> str:
        return (
            f"{self.method} {self.target} -> {self.status}: {self.severity} at "
            f"{self.where}: {self.message}"
        )


@dataclass(frozen=True)
class Call:
    """One exchange through the proxy: ``status`` is what the client got."""

    method: str
    target: str
    status: int


def violations_of(
    method: str, target: str, status: int, headers: Mapping[str, str], body: bytes
) -> list[Violation]:
    """The violations one response from Prism reports (``PrismProxy.violations``).

    Prism reports them in two places: the ``sl-violations`` header (a JSON list
    of every violation found, errors and warnings, when it could still answer)
    and, when it refused, an ``application/problem+json`` body whose
    ``validation`` lists the errors (a refused request has no header).
    """

    def made(severity: str, where: str, message: str) -> Violation:
        return Violation(method, target, status, severity.lower(), where, message)

    def from_list(items: list[dict[str, Any]], prefix: tuple[str, ...]) -> list[Violation]:
        out = []
        for item in items:
            location = tuple(str(p) for p in item.get("location") or ())
            if prefix and location[:1] != prefix:
                location = prefix + location
            message = str(item.get("message", item))
            out.append(made(str(item.get("severity", "error")), ".".join(location), message))
        return out

    lower = {k.lower(): v for k, v in headers.items()}
    header = lower.get("sl-violations")
    if header and not header.startswith("Too many violations!"):
        return from_list(json.loads(header), ())
    found = [] if header is None else [made("error", "response", "over 8 KB of violations")]
    if not lower.get("content-type", "").startswith("application/problem+json"):
        return found
    try:
        problem = json.loads(body)
    except ValueError:  # a HEAD request's answer has no body
        return [*found, made("error", "proxy", f"Prism refused it: {body[:200]!r}")]
    if problem.get("validation"):
        # A refused request's locations say only "body", "query"...: Prism answered
        # before anything went upstream.
        refused = problem.get("type") == PRISM_ERRORS + "UNPROCESSABLE_ENTITY"
        return found + from_list(problem["validation"], ("request",) if refused else ())
    kind = str(problem.get("type", ""))
    detail = f"{kind.removeprefix(PRISM_ERRORS)}: {problem.get('title', '')}"
    if problem.get("detail"):
        detail += f" ({problem['detail']})"
    # Prism's own types judge the request (a route outside the cut, a content
    # type); anything else is Prism failing to reach upstream (FetchError).
    return [*found, made("error", "request" if kind.startswith(PRISM_ERRORS) else "proxy", detail)]


class _Relay(ThreadingHTTPServer):
    """Passes each exchange on to ``target()`` (a base URL) and shows it to ``seen``."""

    daemon_threads = True

    def __init__(
        self,
        target: Callable[[], str],
        seen: Callable[[str, str, int, Mapping[str, str], bytes], None] | None = None,
    ) -> None:
        super().__init__(("127.0.0.1", 0), _RelayHandler)
        self.target = target
        self.seen = seen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _RelayHandler(BaseHTTPRequestHandler):
    """Relays one exchange whole (read, pass on, answer), headers and body unchanged.

    In front of Prism it records what Prism said of each exchange: Prism logs
    a refused one as a single line without its violations. Behind Prism it is
    the switch that lets one Prism serve upstream after upstream (its
    ``Host`` becomes the upstream's own, as if Prism had called it).
    """

    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes: with Nagle on, the client's delayed
    # ACK held every answer 40-50 ms.
    disable_nagle_algorithm = True
    server: _Relay

    def _relay(self) -> None:
        body = self._read_body()
        target = urllib.parse.urlsplit(self.server.target())
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        if self.server.seen is None:
            headers = {k: v for k, v in headers.items() if k.lower() != "host"}
            headers["Host"] = target.netloc
        connection = http.client.HTTPConnection(target.hostname, target.port, timeout=120)
        try:
            path = target.path.rstrip("/") + self.path
            connection.request(self.command, path, body=body, headers=headers)
            response = connection.getresponse()
            status, reply_headers, reply = response.status, response.getheaders(), response.read()
        finally:
            connection.close()
        if self.server.seen is not None:
            self.server.seen(self.command, self.path, status, dict(reply_headers), reply)
        self.send_response_only(status)
        for name, value in reply_headers:
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(reply)

    def _read_body(self) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass  # trailers carry nothing phasegate sends
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _relay

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        """Silent: the recorded calls are the log."""


class PrismProxy:
    """Prism as a validating proxy in front of ``upstream_url``, as a context manager.

    ``with PrismProxy("http://127.0.0.1:8123") as url:`` starts ``prism proxy
    DESCRIPTION UPSTREAM --errors`` on a free port of 127.0.0.1 (its own
    process group), waits until it answers, and yields ``url``: a recording
    relay in front of Prism (``http://127.0.0.1:P``) that a forge's
    ``base_url`` points at. ``description`` is an OpenAPI file used as it is;
    by default the cut of GitHub's (``cached_cut``). On exit Prism's process
    group is stopped (SIGTERM, SIGKILL after ``stop_timeout_s``).

    ``upstream_url`` may be set while running: the next exchange goes there
    (Prism calls a switch that follows it), so one Prism, started once
    (about 2 s, then 0.3-0.7 s the first time each operation's schemas are
    compiled), serves the fake GitHub of test after test; ``reset()`` between.

    ``violations()`` lists what GitHub's description did not allow, in order;
    ``assert_clean()`` raises ``AssertionError`` listing them; ``calls`` holds
    every exchange. Raises ``PrismError`` when Prism or the description is
    missing, or Prism exits or does not answer within ``start_timeout_s``
    (the message carries its log).
    """

    def __init__(
        self,
        upstream_url: str,
        description: Path | str | None = None,
        *,
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.upstream_url = upstream_url
        self.description = Path(description) if description is not None else None
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.calls: list[Call] = []
        self._violations: list[Violation] = []
        self._lock = threading.Lock()
        self._log_mark = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._front: _Relay | None = None
        self._switch: _Relay | None = None
        self._log_dir: tempfile.TemporaryDirectory[str] | None = None
        self.prism_url = ""
        self.url = ""

    # -- lifecycle --------------------------------------------------------

    def __enter__(self) -> str:
        prism = find_prism()
        description = self.description or cached_cut()
        if not description.is_file():
            raise PrismError(f"no OpenAPI description at {description}")
        self._log_dir = tempfile.TemporaryDirectory(prefix="phasegate-prism-log-")
        try:
            self._switch = _serve(_Relay(lambda: self.upstream_url))
            self.prism_url = f"http://127.0.0.1:{self._start(prism, description)}"
            self._front = _serve(_Relay(lambda: self.prism_url, self._record))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.url = self._front.url
        return self.url

    def __exit__(self, *exc_info: object) -> None:
        for relay in (self._front, self._switch):
            if relay is not None:
                relay.shutdown()
                relay.server_close()
        self._front = self._switch = None
        if self._process is not None:
            _stop_group(self._process, self.stop_timeout_s)
            self._process = None
        if self._log_dir is not None:
            self._log_dir.cleanup()
            self._log_dir = None

    def _start(self, prism: str, description: Path) -> int:
        assert self._log_dir is not None and self._switch is not None
        log_path = Path(self._log_dir.name) / "prism.log"
        # No colours: the log is read by people in a failed test's output.
        env = {**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0"}
        for _attempt in range(3):
            port = _free_port()
            with log_path.open("wb") as log:
                self._process = subprocess.Popen(
                    [prism, "proxy", str(description), self._switch.url, "--errors",
                     "--port", str(port), "--host", "127.0.0.1"],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    env=env, start_new_session=True,
                )  # fmt: skip
            if self._wait_ready(port):
                return port
            text = self.log()
            _stop_group(self._process, self.stop_timeout_s)
            self._process = None
            if "EADDRINUSE" not in text:
                raise PrismError(f"Prism did not start ({prism}):\n{text[-4000:]}")
        raise PrismError(f"Prism found no free port:\n{text[-4000:]}")

    def _wait_ready(self, port: int) -> bool:
        assert self._process is not None
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            try:
                # Any answer will do: outside the description it is Prism's own 404.
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2).close()
                return True
            except urllib.error.HTTPError as answer:
                answer.close()
                return True
            except OSError:
                time.sleep(0.05)
        return False

    @property
    def pid(self) -> int:
        """Prism's process id, also its process group's (``PrismError`` if not running)."""
        if self._process is None:
            raise PrismError("Prism is not running")
        return self._process.pid

    # -- what Prism said --------------------------------------------------

    def _record(
        self, method: str, target: str, status: int, headers: Mapping[str, str], body: bytes
    ) -> None:
        found = violations_of(method, target, status, headers, body)
        with self._lock:
            self.calls.append(Call(method, target, status))
            self._violations.extend(found)

    def reset(self) -> None:
        """Forget the calls and violations so far (one proxy, many tests)."""
        with self._lock:
            self.calls.clear()
            self._violations.clear()
            self._log_mark = len(self.log())

    def violations(self, *, warnings: bool = True) -> list[Violation]:
        """Every violation so far, in order; ``warnings=False`` keeps the errors
        only (an undocumented 4xx/5xx status, as a fault on demand gives, is a
        warning). An upstream 501 is one too, found in Prism's log: Prism
        answers it with a mock of its own, 2xx, that no response shows."""
        remocked = [
            Violation("?", path, 501, "error", "proxy", _REMOCKED)
            for path in _UPSTREAM_501.findall(self.log()[self._log_mark :])
        ]
        with self._lock:
            found = self._violations + remocked
        return [v for v in found if warnings or v.severity == "error"]

    def assert_clean(self, *, warnings: bool = False) -> None:
        """Raises ``AssertionError`` listing every error (and warning, if asked)."""
        found = self.violations(warnings=warnings)
        if found:
            lines = "\n".join(f"  {v}" for v in found)
            raise AssertionError(
                f"GitHub's schema was violated {len(found)} time(s) (Prism):\n{lines}"
            )

    def log(self) -> str:
        """Prism's own log so far (plain text; empty once the proxy has stopped)."""
        if self._log_dir is None:
            return ""
        path = Path(self._log_dir.name) / "prism.log"
        return path.read_text(errors="replace") if path.exists() else ""


def _serve(relay: _Relay) -> _Relay:
    threading.Thread(target=relay.serve_forever, daemon=True).start()
    return relay


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _stop_group(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM to the process group, SIGKILL after ``timeout_s`` seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
