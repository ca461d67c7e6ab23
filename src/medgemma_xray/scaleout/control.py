"""Status and hot switch for every replica of a Ray Serve application, through the affinity router's
`target_replica` (each command is routed to one named replica by Serve's own routing hook).

    python -m medgemma_xray.scaleout.control status [--app medgemma]          # JSON: one entry per replica
    python -m medgemma_xray.scaleout.control switch trt|pytorch [--app medgemma]
Run it on a node of the cluster medgemma-xray-ray started (it joins with ray.init(address="auto"), with that
cluster's token and, unless ALLOW_RAY_NETWORK, on loopback). Exit status: 0 every replica did
it, 1 some replica failed (the JSON says which), 2 bad usage or no cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

MODEL_DEPLOYMENT = "ModelReplica"


def _router(handle, timeout_s: float = 30.0):
    """The affinity router behind this handle in this process, once it knows the replicas."""
    from medgemma_xray.scaleout.router import live_routers

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for router in live_routers(MODEL_DEPLOYMENT):
            if router.curr_replicas:
                return router
        handle.info.remote().result(timeout_s=timeout_s)  # a first call makes Serve create the router
        time.sleep(0.2)
    raise RuntimeError(f"no replica of {MODEL_DEPLOYMENT} became known within {timeout_s:g} s")


def replica_ids(handle) -> list[str]:
    return sorted(replica_id.unique_id for replica_id in _router(handle).curr_replicas)


def replica_stats(handle=None) -> list[dict]:
    """What each replica last reported through Serve's routing stats (its readiness, mode and breaker). Never
    blocks: with handle=None (the ingress, which may be on Serve's event loop) it reads the routers this process
    already has, and is empty before the first request."""
    from medgemma_xray.scaleout.router import live_routers

    if handle is not None:
        router = _router(handle)
    else:
        router = next((r for r in live_routers(MODEL_DEPLOYMENT) if r.curr_replicas), None)
        if router is None:
            return []
    return [
        {"id": replica_id.unique_id, **(replica.routing_stats or {})}
        for replica_id, replica in sorted(router.curr_replicas.items(), key=lambda item: item[0].unique_id)
    ]


def broadcast(handle, method: str, *args, timeout_s: float = 600.0) -> dict[str, object]:
    """Call `method` on every replica; {replica id: result or {"ok": False, "error": ...}}."""
    responses = {target: getattr(handle, method).remote(*args, target_replica=target) for target in replica_ids(handle)}
    results: dict[str, object] = {}
    for target, response in responses.items():
        try:
            results[target] = response.result(timeout_s=timeout_s)
        except Exception as exc:
            results[target] = {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--app", default="medgemma", help="the Serve application's name")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("status")
    switch = commands.add_parser("switch")
    switch.add_argument("mode", choices=["pytorch", "trt"])
    args = parser.parse_args(argv)
    import os

    from medgemma_xray.scaleout.cluster import ClusterConfigError, network_allowed, ray_environment

    try:  # this cluster's token and, unless ALLOW_RAY_NETWORK, Ray's single-host (loopback) mode
        environ = dict(os.environ)
        os.environ.update(ray_environment(environ, network_allowed(environ), create_token=False))
    except ClusterConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import ray
    from ray import serve

    try:
        # ray.init takes a level name too (its own default is the string ray_constants.LOGGER_LEVEL); its stub says int
        ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
        handle = serve.get_deployment_handle(MODEL_DEPLOYMENT, app_name=args.app)
    except Exception as exc:
        print(f"error: cannot reach the Serve application {args.app!r}: {exc}", file=sys.stderr)
        return 2
    command = ("status",) if args.command == "status" else ("switch", args.mode)
    results = broadcast(handle, *command)
    print(json.dumps(results, indent=2, default=str))
    failed = [key for key, value in results.items() if isinstance(value, dict) and value.get("ok") is False]
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
