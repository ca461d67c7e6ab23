"""The running server's core: the service (leases, hot switch), breaker, metrics, settings, control channel."""
