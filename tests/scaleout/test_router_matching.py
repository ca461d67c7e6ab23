"""The affinity router gives each request the replica chosen for it. With Serve's FIFOMixin, the replica chosen
for one request went to the oldest request waiting: under load a status command for one replica was answered by
the other (tests/scaleout/test_ray_serve.py failed that way on a loaded machine), and a conversation's turn could
land away from its KV. Serve's own router, driven as Serve drives it, no cluster."""

from __future__ import annotations

import asyncio


def test_a_replica_chosen_for_one_request_is_not_handed_to_an_older_one():
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
    from ray.serve.request_router import PendingRequest

    from medgemma_xray.scaleout.router import ConversationAffinityRouter

    async def scenario() -> tuple[object, bool]:
        router = ConversationAffinityRouter(
            DeploymentID(name="ModelReplica", app_name="medgemma"), DeploymentHandleSource.UNKNOWN
        )
        router.initialize_state()
        older = PendingRequest([], {"target_replica": "a"}, RequestMetadata(request_id="1", internal_request_id="1"))
        newer = PendingRequest([], {"target_replica": "b"}, RequestMetadata(request_id="2", internal_request_id="2"))
        for pending in (older, newer):  # both waiting, as Serve queues them
            router._pending_requests_to_fulfill.append(pending)
            router._add_pending_request_to_indices(pending)
        router._fulfill_next_pending_request("replica b", newer.metadata)  # the routing task of `newer` found b
        return (newer.future.result() if newer.future.done() else None), older.future.done()

    newer_got, older_done = asyncio.run(scenario())
    assert newer_got == "replica b" and not older_done
