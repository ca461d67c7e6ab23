"""The transformers reference backend (eager) and its fast GPU path. Imports torch lazily, inside the backend."""
