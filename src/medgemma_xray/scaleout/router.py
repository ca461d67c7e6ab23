"""Conversation affinity through Ray Serve's own request-routing hook (a RequestRouter subclass): a request goes
to the replica that holds its conversation's KV state.

The routing key is a keyword argument of the call (`routing_key`): the conversation id (the caller may pass any
stable key, e.g. a film's content hash, once replicas share an image cache across conversations).
- A key seen before goes to the replica it went to last, while that replica is alive.
- A new key, or one whose replica died, goes to the replica chosen by rendezvous hashing over the live replicas
  (highest hash of key + replica id): every ingress and every process picks the same one without shared state, and
  when a replica dies only its own keys move. A request there finds no KV and prefills the whole conversation,
  which the client sent anyway (the OpenAI API and the UI both send the full history): a transparent re-prefill.
- A call with `target_replica=<id>` goes to exactly that replica: how a switch or status command reaches each one.
The pinned replica is offered first and the others after it, so a replica at its max_ongoing_requests does not
stall the request: Serve tries the next rank, which re-prefills there.
"""

from __future__ import annotations

import hashlib
import weakref
from collections import OrderedDict

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

MAX_PINNED_KEYS = 100_000
_ROUTERS: weakref.WeakSet = weakref.WeakSet()


def live_routers(deployment_name: str) -> list:
    """The affinity routers of this process for a deployment (one per handle)."""
    return [router for router in list(_ROUTERS) if router._deployment_id.name == deployment_name]


def rendezvous_rank(key: str, replicas: list[RunningReplica]) -> list[RunningReplica]:
    def weight(replica: RunningReplica) -> bytes:
        return hashlib.sha256(f"{key}\0{replica.replica_id.unique_id}".encode()).digest()

    return sorted(replicas, key=weight, reverse=True)


class ConversationAffinityRouter(RequestRouter):
    """Without Serve's FIFOMixin: it hands the replica chosen for one request to the oldest request waiting, so
    under load a status command for replica A was answered by replica B, and a conversation's turn could land on
    another conversation's replica (found by the suite on a loaded 2-core machine, 2026-12-02). RequestRouter's
    own matching gives each request the replica chosen for it."""

    def initialize_state(self, **kwargs) -> None:
        super().initialize_state(**kwargs)
        self._pinned: OrderedDict[str, ReplicaID] = OrderedDict()
        # Serve may ship this class by value (cloudpickle), with a copy of this module's globals: register in the
        # imported module, where live_routers looks.
        import medgemma_xray.scaleout.router as home

        home._ROUTERS.add(self)

    @staticmethod
    def _kwarg(pending_request: PendingRequest | None, name: str) -> str | None:
        if pending_request is None:
            return None
        value = pending_request.kwargs.get(name)
        return str(value) if value is not None else None

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        target = self._kwarg(pending_request, "target_replica")
        if target is not None:
            return [[replica for replica in candidate_replicas if replica.replica_id.unique_id == target]]
        key = self._kwarg(pending_request, "routing_key")
        if key is None:
            return [
                rendezvous_rank(str(pending_request.metadata.request_id if pending_request else ""), candidate_replicas)
            ]
        ranked = rendezvous_rank(key, candidate_replicas)
        pinned = self._pinned.get(key)
        first = next((replica for replica in ranked if replica.replica_id == pinned), ranked[0])
        return [[first], [replica for replica in ranked if replica is not first]]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result) -> None:
        key = self._kwarg(pending_request, "routing_key")
        if key is None or self._kwarg(pending_request, "target_replica") is not None:
            return
        self._pinned[key] = replica_id
        self._pinned.move_to_end(key)
        while len(self._pinned) > MAX_PINNED_KEYS:
            self._pinned.popitem(last=False)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        for key in [key for key, pinned in self._pinned.items() if pinned == replica_id]:
            del self._pinned[key]
