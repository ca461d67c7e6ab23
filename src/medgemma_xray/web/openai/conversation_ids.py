"""Conversation ids that belong to the client that started them.

A conversation keeps its KV between turns, so a client that could name another's conversation would learn from
usage.prompt_tokens_details.cached_tokens how far its guess matches the other's question, and could hold that
conversation with 409s. So the server issues the ids: "mgx-" + a random nonce + an HMAC of the nonce and the
client's login name (empty when login is off) under a key that lives only in this process. A client continues a
conversation only with an id the server gave it; another login cannot use it, and nobody can guess one.

Any other string a client sends as conversation_id (a label such as "case-17", another login's id, or an id from
before a restart, whose key died with the process and its KV) starts a new kept conversation; the answer returns
its id in medgemma.conversation_id. The client sends the whole conversation every time, so its answer is the same
either way: only the reuse of the KV is lost. The KV key the backend sees is derived from the nonce and the login,
never from the client's text.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

PREFIX = "mgx-"
NONCE_BYTES = 16


def _encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass(frozen=True)
class BoundConversation:
    public_id: str  # what the client sends back
    key: str  # what the backend keys the KV by


class ConversationIds:
    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def _signature(self, nonce: str, user: str | None) -> str:
        message = f"{user or ''}\0{nonce}".encode()
        return _encode(hmac.new(self._secret, message, hashlib.sha256).digest()[:16])

    def _bound(self, nonce: str, user: str | None) -> BoundConversation:
        key = "api-" + hashlib.sha256(f"{user or ''}\0{nonce}".encode()).hexdigest()[:32]
        return BoundConversation(f"{PREFIX}{nonce}.{self._signature(nonce, user)}", key)

    def bind(self, requested: str | None, user: str | None) -> BoundConversation | None:
        """None: a stateless answer. An id this server issued to this login: that conversation. Anything else: a
        new conversation."""
        if requested is None:
            return None
        nonce, _, signature = requested.removeprefix(PREFIX).partition(".")
        issued = requested.startswith(PREFIX) and nonce and len(nonce) <= 2 * NONCE_BYTES
        if issued and hmac.compare_digest(signature.encode(), self._signature(nonce, user).encode()):
            return self._bound(nonce, user)
        return self._bound(_encode(secrets.token_bytes(NONCE_BYTES)), user)
