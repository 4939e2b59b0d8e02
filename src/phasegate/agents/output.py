"""An agent's output while it runs: its lines as ``agent_output`` events.

Event rows, not a log file: they are what the dashboard's live stream
(``web/live.py``) and ``phasegate events --follow`` already read, resumable by
id, in one store whatever the number of workers and machines (a file under
one worker's ``.phasegate/`` is not seen by a dashboard elsewhere). They are
written outside ``commit_phase_result``: they are what a person watches, not
evidence, and no phase reads them.

The store's write load stays low and every run's rows stay bounded:

- at most one row per ``interval_s`` (INTERVAL_S, 0.5 s) per run, written by a
  thread of its own, so the process's reader never waits on the store;
- a row holds at most ``row_chars`` (ROW_CHARS) of text: when more came in one
  interval, its last lines, after a note of how many were skipped;
- a run writes about ``run_chars`` (RUN_CHARS) in ``run_rows`` (RUN_ROWS) rows
  at most; past either a note says so, and when the agent ends, one more row
  holds its last lines (at most ``row_chars``) and how many were not shown;
- a line longer than ``line_chars`` (LINE_CHARS) is a note, never part of it;
- a run that prints nothing writes no row.

No secret reaches a row: each row's text is redacted (``redaction.redact``, raw
and encoded) of ``secrets`` before it is written, and only whole lines are
written, so a secret is never cut in two by a chunk boundary. A line is what a
terminal would show of it: after its last carriage return, without colour
codes.

Row data: ``{"role", "phase", "round", "text"}``; ``text`` is whole lines, each
ending in a newline.
"""

from __future__ import annotations

import codecs
import logging
import re
import threading
from collections import deque
from collections.abc import Callable, Sequence
from types import TracebackType

from phasegate.core.contract import EventWrite
from phasegate.core.redaction import redact
from phasegate.store import StoreUnavailable

__all__ = [
    "AGENT_OUTPUT",
    "INTERVAL_S",
    "LINE_CHARS",
    "OutputLog",
    "ROW_CHARS",
    "RUN_CHARS",
    "RUN_ROWS",
]

log = logging.getLogger(__name__)

#: The event type of an agent's live output.
AGENT_OUTPUT = "agent_output"
#: Seconds between two rows of one run, at the least.
INTERVAL_S = 0.5
#: Characters of text one row holds at the most (its notes aside).
ROW_CHARS = 8 * 1024
#: Characters one run streams before only its last lines are kept for its end.
RUN_CHARS = 256 * 1024
#: Rows one run streams before only its last lines are kept for its end.
RUN_ROWS = 1000
#: Characters of one line, at the most; a longer line is a note.
LINE_CHARS = 4000

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")


class OutputLog:
    """The live output of one agent run, fed by its process's reader.

    ``emit(event)`` writes one ``agent_output`` EventWrite (the service's: the
    store's event rows); it is called from this log's thread while the run
    goes on, and once more on ``close``, never from ``feed``. A store that is
    unavailable loses the row (logged), never the run. Use it as a context
    manager around the run: entering starts the thread, leaving writes what is
    left and stops it.
    """

    def __init__(
        self,
        emit: Callable[[EventWrite], None],
        secrets: Sequence[str],
        *,
        role: str,
        phase: str,
        round: int = 0,
        interval_s: float = INTERVAL_S,
        row_chars: int = ROW_CHARS,
        run_chars: int = RUN_CHARS,
        run_rows: int = RUN_ROWS,
        line_chars: int = LINE_CHARS,
    ) -> None:
        self._emit = emit
        self._secrets = list(secrets)
        self._data = {"role": role, "phase": phase, "round": round}
        self._interval_s = interval_s
        self._row_chars = row_chars
        self._run_chars = run_chars
        self._run_rows = run_rows
        self._line_chars = line_chars
        self._lock = threading.Lock()  # feed (the reader's thread) against _take
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._decoders: dict[str, codecs.IncrementalDecoder] = {}
        self._partial: dict[str, str] = {}
        self._overlong: set[str] = set()  # streams inside a line too long to show
        self._pending: deque[str] = deque()
        self._pending_chars = 0
        self._skipped = 0  # lines of the current interval past row_chars
        self._written = 0  # characters this run's rows held so far
        self._rows = 0  # rows this run wrote so far
        self._tail: deque[str] = deque()  # past run_chars: the last lines only
        self._tail_chars = 0
        self._unshown = 0  # lines past run_chars
        self._closed = False

    # -- feeding (the process reader's thread) ----------------------------------

    def feed(self, stream: str, data: bytes) -> None:
        """What ``stream`` ("stdout", "stderr") of the agent wrote, raw: kept until
        the next row. Returns at once; never raises; nothing after ``close``."""
        with self._lock:
            if self._closed:
                return
            decoder = self._decoders.get(stream)
            if decoder is None:
                decoder = self._decoders[stream] = codecs.getincrementaldecoder("utf-8")("replace")
            self._split(stream, decoder.decode(data))

    def _split(self, stream: str, text: str) -> None:
        *lines, rest = (self._partial.get(stream, "") + text).split("\n")
        for line in lines:
            if stream in self._overlong or len(line) > self._line_chars:
                self._overlong.discard(stream)
                self._add(f"[phasegate: a line over {self._line_chars} characters not shown]")
            else:
                self._add(_shown(line))
        if len(rest) > self._line_chars:
            # Dropped whole, never cut: a cut line could cut a secret in two.
            self._overlong.add(stream)
            rest = ""
        self._partial[stream] = rest

    def _add(self, line: str) -> None:
        if self._full():
            self._unshown += 1
            self._tail.append(line)
            self._tail_chars += len(line) + 1
            while self._tail_chars > self._row_chars and self._tail:
                self._tail_chars -= len(self._tail.popleft()) + 1
            return
        self._pending.append(line)
        self._pending_chars += len(line) + 1
        while self._pending_chars > self._row_chars and self._pending:
            self._pending_chars -= len(self._pending.popleft()) + 1
            self._skipped += 1

    # -- writing (this log's thread, then close) --------------------------------

    def _take(self) -> str | None:
        """The next row's text (unredacted), or None when nothing is pending."""
        with self._lock:
            if not self._pending and not self._skipped:
                return None
            lines = list(self._pending)
            if self._skipped:
                lines.insert(
                    0,
                    f"[phasegate: {self._skipped} line(s) skipped: over "
                    f"{self._row_chars} characters in {self._interval_s:g} s]",
                )
            self._pending.clear()
            self._pending_chars = self._skipped = 0
            text = "".join(f"{line}\n" for line in lines)
            self._written += len(text)
            self._rows += 1
            if self._full():
                text += (
                    f"[phasegate: past {self._run_chars} characters or {self._run_rows} rows "
                    "the output is not streamed; its last lines come when the agent ends]\n"
                )
            return text

    def _full(self) -> bool:
        return self._written >= self._run_chars or self._rows >= self._run_rows

    def _write(self, text: str | None) -> None:
        if not text:
            return
        event = EventWrite(AGENT_OUTPUT, {**self._data, "text": redact(text, self._secrets)})
        try:
            self._emit(event)
        except StoreUnavailable as exc:
            # What a person watches, not evidence: the run goes on without this row.
            log.warning("agent output of %s not written: %s", self._data["role"], exc)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._write(self._take())

    def __enter__(self) -> OutputLog:
        self._thread = threading.Thread(
            target=self._loop, name=f"phasegate-output-{self._data['role']}", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Write what is left (a last unfinished line counts as a line) and, when the
        run passed ``run_chars``, a row with its last lines; then stop. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            if self._closed:
                return
            for stream, decoder in self._decoders.items():
                self._split(stream, decoder.decode(b"", final=True))
            for stream in list(self._decoders):
                if self._partial.get(stream) or stream in self._overlong:
                    self._split(stream, "\n")
            self._closed = True
        self._write(self._take())
        with self._lock:
            tail, unshown = list(self._tail), self._unshown
        if unshown:
            hidden = unshown - len(tail)
            note = f"[phasegate: {unshown} line(s) past the cap"
            note += f", of which {hidden} not shown; the last {len(tail)}:]" if hidden else ":]"
            self._write(note + "\n" + "".join(f"{line}\n" for line in tail))


def _shown(line: str) -> str:
    """What a terminal shows of ``line``: after its last carriage return (a
    progress bar's last state), without colour codes."""
    return _ANSI.sub("", line.rstrip("\r").rsplit("\r", 1)[-1])
