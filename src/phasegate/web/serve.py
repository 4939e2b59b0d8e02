"""``phasegate serve``'s machinery: the dashboard (uvicorn) and the worker side by side.

Both run on threads of their own; the caller's thread waits on the engine's
shutdown (which its signal handler sets: the CLI's ``graceful``). Shutdown
stops the worker as ``phasegate worker``'s does (every running agent
stopped, each workflow paused resumable), ends the live streams, then the
server. The worker's end for any other reason (an error) ends the server
too: a dashboard whose workflows no longer move must not look alive.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass, field

import uvicorn

from phasegate.runtime.engine import Engine
from phasegate.web.app import create_app
from phasegate.web.auth import Access

__all__ = ["Dashboard"]

log = logging.getLogger(__name__)

#: Seconds uvicorn waits for open requests (a live stream ends at once) when stopping.
GRACEFUL_S = 5


@dataclass
class Dashboard:
    """A dashboard on ``engine`` at ``host``:``port`` (0: a free port, read back
    with ``url`` after ``start``), with a worker of ``concurrency`` threads
    (``run_worker``; ``worker=False``: none, the workflows are another worker's)."""

    engine: Engine
    access: Access
    host: str = "127.0.0.1"
    port: int = 8765
    concurrency: int = 1
    poll_s: float = 2.0
    worker: bool = True
    #: who reads /metrics (``web.metrics.METRICS_MODES``)
    metrics: str = "token"
    errors: list[BaseException] = field(default_factory=list)

    def start(self) -> str:
        """Bind, start the server and the worker; return the base URL once the
        server accepts requests. Raises OSError when the address is taken."""
        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        app = create_app(
            self.engine, self.access, stop=self.engine.shutdown, metrics_mode=self.metrics
        )
        config = uvicorn.Config(
            app, log_level="warning", timeout_graceful_shutdown=GRACEFUL_S, lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._threads = [
            threading.Thread(target=self._serve, args=(sock,), name="phasegate-serve", daemon=True)
        ]
        if self.worker:
            self._threads.append(
                threading.Thread(target=self._work, name="phasegate-worker", daemon=True)
            )
        for thread in self._threads:
            thread.start()
        while not self._server.started and self._threads[0].is_alive():
            self.engine.shutdown.wait(0.02)
        return self.url

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def wait(self) -> None:
        """Block until the engine's shutdown is set (a signal, ``stop``, the worker's
        end), then stop both and return. ``errors`` holds what the worker raised."""
        self.engine.shutdown.wait()
        self._stop_threads()

    def stop(self) -> None:
        self.engine.shutdown.set()
        self._stop_threads()

    def _stop_threads(self) -> None:
        self._server.should_exit = True
        for thread in self._threads:
            thread.join()

    def _serve(self, sock: socket.socket) -> None:
        try:
            self._server.run(sockets=[sock])
        finally:
            sock.close()
            self.engine.shutdown.set()

    def _work(self) -> None:
        try:
            self.engine.run_worker(poll_s=self.poll_s, concurrency=self.concurrency)
        except BaseException as exc:  # reported by ``serve``, after the server stopped
            log.error("the worker stopped: %s", exc)
            self.errors.append(exc)
        finally:
            self.engine.shutdown.set()
