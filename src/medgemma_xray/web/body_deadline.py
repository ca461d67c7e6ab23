"""A deadline on reading a request's body: the body must arrive within BODY_TIMEOUT_S plus one second for every
MIN_BODY_BYTES_PER_S it carries.

uvicorn bounds the request head (listener.guarded_protocol) but not the body: a POST that sends one byte every five
seconds holds its connection, and a place in the budget, for as long as it likes. A film of 64 MiB on a link of
1 MiB/s is allowed about a minute more than a small JSON call; one byte every five seconds is cut off after
BODY_TIMEOUT_S. The reader sees the client as gone, and the client gets 408 and a closed connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

logger = logging.getLogger(__name__)

MIN_BODY_BYTES_PER_S = 64 << 10
SLOW_BODY_MESSAGE = "The request body arrived too slowly and was not read to its end. Send it again."


class BodyDeadline:
    """ASGI middleware; the outermost, so every reader of the body (the guards, Gradio, the API) is bounded."""

    def __init__(self, app, timeout_s: float, min_bytes_per_s: int = MIN_BODY_BYTES_PER_S) -> None:
        self.app, self.timeout_s, self.min_bytes_per_s = app, timeout_s, min_bytes_per_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.monotonic()
        state = {"received": 0, "complete": False, "expired": False, "responded": False}

        async def bounded_receive():
            if state["complete"] or state["expired"]:
                return await receive() if not state["expired"] else {"type": "http.disconnect"}
            remaining = started + self.timeout_s + state["received"] / self.min_bytes_per_s - time.monotonic()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(remaining, 0.001))
            except TimeoutError:
                state["expired"] = True
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                state["complete"] = not message.get("more_body", False)
            return message

        async def watched_send(message) -> None:
            if state["expired"] and not state["responded"]:
                return  # the 408 below goes out instead
            if message["type"] == "http.response.start":
                state["responded"] = True
            await send(message)

        try:
            await self.app(scope, bounded_receive, watched_send)
        except Exception:
            if not state["expired"]:
                raise
        if state["expired"] and not state["responded"]:
            logger.warning("closed a request whose body arrived too slowly (%d bytes read)", state["received"])
            body = json.dumps({"detail": SLOW_BODY_MESSAGE}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 408,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"connection", b"close"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
