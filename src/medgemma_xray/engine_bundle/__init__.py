"""The engine bundle format: manifest, attention masks, file hashes. Shared by the build and the runtime; imports neither."""
