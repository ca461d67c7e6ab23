"""The command lines other than the server's: batch work over a folder of films, the engine-bundle build, and the
container's entry point. Each is an entry point in pyproject.toml and a main(argv) that returns an exit status."""
