"""What every fake forge's webhooks do alike: deliveries sent in order from a thread of their own.

A forge's hooks class (gitea_hooks.py, gitlab_hooks.py, github_hooks.py) is
a ``Deliveries``: it keeps its ``hooks`` (numbered by ``next_id``), decides
which of them an event reaches and how each delivery is signed and named,
and hands each one to ``send``. The model announces under its lock; the
POSTs leave from the deliverer's thread, so a receiver that calls the API
back does not wait on that lock. Each delivery keeps the status its receiver
answered (None: none came) and the start of its answer, or why none came.

``receiving_hooks`` is the other end for a test: an HTTP receiver keeping
every POST it gets.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Generic, Protocol, TypeVar

import httpx

__all__ = ["DELIVERY_TIMEOUT_S", "Deliveries", "Delivery", "receiving_hooks"]

#: How long a forge waits for a receiver's answer before it counts a delivery failed.
DELIVERY_TIMEOUT_S = 10.0


class Target(Protocol):
    url: str


class Delivery(Protocol):
    """What the deliverer needs of one delivery (each forge's ``Delivered``)."""

    hook: Target
    headers: dict[str, str]
    body: bytes
    status: int | None
    answer: str
    done: threading.Event


H = TypeVar("H")
D = TypeVar("D", bound=Delivery)


class Deliveries(Generic[H, D]):
    """The hooks of a fake forge and what was delivered to them (see the module docstring)."""

    def __init__(self, thread_name: str) -> None:
        self.hooks: list[H] = []
        self.delivered: list[D] = []
        self.thread_name = thread_name
        self.ids = itertools.count(1)
        self.waiting: queue.Queue[D | None] = queue.Queue()
        self.thread: threading.Thread | None = None

    def next_id(self) -> int:
        return next(self.ids)

    def send(self, delivered: D) -> None:
        """Keep ``delivered`` and queue it for the deliverer's thread."""
        self.delivered.append(delivered)
        if self.thread is None:
            self.thread = threading.Thread(target=self.deliver, name=self.thread_name, daemon=True)
            self.thread.start()
        self.waiting.put(delivered)

    def wait_all(self, timeout_s: float = DELIVERY_TIMEOUT_S) -> list[D]:
        """Every delivery so far, once each has its answer (or ``timeout_s`` passed)."""
        for delivered in list(self.delivered):
            delivered.done.wait(timeout_s)
        return list(self.delivered)

    def stop(self) -> None:
        if self.thread is not None:
            self.waiting.put(None)
            self.thread.join(timeout=DELIVERY_TIMEOUT_S + 1)
            self.thread = None

    def deliver(self) -> None:
        """POST each queued delivery in turn until ``stop``."""
        with httpx.Client(timeout=DELIVERY_TIMEOUT_S) as client:
            while (delivered := self.waiting.get()) is not None:
                try:
                    answer = client.post(
                        delivered.hook.url, content=delivered.body, headers=delivered.headers
                    )
                    delivered.status, delivered.answer = answer.status_code, answer.text[:2000]
                except httpx.HTTPError as exc:
                    delivered.answer = f"{type(exc).__name__}: {exc}"
                finally:
                    delivered.done.set()


@contextlib.contextmanager
def receiving_hooks(status: int = 200) -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    """An HTTP receiver on 127.0.0.1 answering every POST ``status`` with no body:
    its URL and the (headers, body) of each POST, in order. Shut down after."""
    received: list[tuple[dict[str, str], bytes]] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(
                (dict(self.headers.items()), self.rfile.read(int(self.headers["Content-Length"])))
            )
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            """Silent."""

    with ThreadingHTTPServer(("127.0.0.1", 0), Receiver) as receiver:
        threading.Thread(target=receiver.serve_forever, daemon=True).start()
        try:
            yield f"http://127.0.0.1:{receiver.server_port}/hook", received
        finally:
            receiver.shutdown()
