"""The ingress's HTTP door: the single server's guarded uvicorn listener, run inside the Ingress replica.

Ray Serve's own HTTP proxy has no request-head timeout, no connection budget per client and no body deadline: 1,200
half-open connections were all still open after 25 s. So the ingress does not take its HTTP from Serve's proxy
(which listens on 127.0.0.1 only, for Serve's own health checks): it listens on HOST:PORT itself, with
web.http_server.guarded_uvicorn_config, the same head timeout, connection budget, body deadline and login as the
single server.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

logger = logging.getLogger(__name__)


class IngressListener:
    """Owns one uvicorn server and the thread it runs in. start() returns once the port is bound (a taken port
    raises there, so Serve reports the replica as failed); close() stops the server and joins the thread."""

    def __init__(self, app, settings) -> None:
        self.app, self.settings = app, settings
        self._server: Any = None  # the uvicorn.Server, made at start() (uvicorn is imported there)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        import uvicorn

        from medgemma_xray.web.http_server import guarded_uvicorn_config
        from medgemma_xray.web.listener import raise_open_file_limit, reserve_port

        socket = reserve_port(self.settings.host, self.settings.port)
        raise_open_file_limit()
        self._server = uvicorn.Server(guarded_uvicorn_config(self.app, self.settings))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [socket]}, name="ingress-listener", daemon=True
        )
        self._thread.start()
        logger.info("ingress listening on http://%s:%d", self.settings.host, self.settings.port)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self, timeout_s: float = 10.0) -> None:
        """Idempotent."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None
