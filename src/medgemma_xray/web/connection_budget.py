"""The connection budget: how many connections one client may hold, how many the server holds for everyone, and
the share kept for the probes.

One client (an address) that opens heartbeat streams, or POSTs that send a body byte every few seconds, could
otherwise take every one of MAX_CONNECTIONS and turn /healthz, /v1/models and everyone's questions into 503s. So:

- each address holds at most PER_CLIENT_CONNECTIONS connections; its next ones get 503 with Retry-After (another
  address never notices);
- past MAX_CONNECTIONS connections in all, new connections get 503 for everything but the probes;
- the probes (/healthz, /readyz, /metrics) are answered on any connection, and PROBE_RESERVE connections beyond
  MAX_CONNECTIONS are kept for them (uvicorn's own hard limit is MAX_CONNECTIONS + PROBE_RESERVE).

The decision is taken once per connection, when it opens (listener.guarded_protocol), as nginx's limit_conn does;
the book lives on the server's one event loop, so it needs no lock.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field

PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})
PROBE_RESERVE = 64  # connections beyond MAX_CONNECTIONS that only the probes may use
RETRY_AFTER_S = 10
CLIENT_FULL_MESSAGE = (
    "This client already holds as many connections as one client may (PER_CLIENT_CONNECTIONS). "
    "Close some (other tabs, streams or uploads) and retry."
)
SERVER_FULL_MESSAGE = "The server is at its connection limit. Please retry in a few seconds."


@dataclass
class ConnectionBook:
    """Open connections per client address, for one server (one event loop)."""

    per_client: int
    max_connections: int
    open_by_address: Counter = field(default_factory=Counter)

    def admit(self, address: str | None, open_connections: int):
        """None when the connection is within budget (and is then counted for its address), else the refusal
        message. open_connections: the server's open connections, this one included."""
        if address is not None and self.open_by_address[address] >= self.per_client:
            return CLIENT_FULL_MESSAGE
        if open_connections > self.max_connections:
            return SERVER_FULL_MESSAGE
        if address is not None:
            self.open_by_address[address] += 1
        return None

    def release(self, address: str | None) -> None:
        if address is None:
            return
        self.open_by_address[address] -= 1
        if self.open_by_address[address] <= 0:
            del self.open_by_address[address]


def over_budget_app(app, message: str):
    """The ASGI app for a connection that is over its budget: the probes still reach `app`; every other request
    gets 503 with Retry-After and the connection closes after it."""
    body = json.dumps({"detail": message, "error": {"message": message, "type": "server_busy", "code": 503}}).encode()

    async def refuse(scope, receive, send) -> None:
        if scope["type"] == "http" and scope.get("path") in PROBE_PATHS:
            return await app(scope, receive, send)
        if scope["type"] != "http":
            return None
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", str(RETRY_AFTER_S).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return refuse
