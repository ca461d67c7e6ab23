"""Tooling for tests and the demo: synthetic phantom films, the demo checkpoint. Never imported by serving."""
