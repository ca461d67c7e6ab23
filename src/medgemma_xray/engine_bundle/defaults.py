"""Defaults that the build, both backends and the service settings share, each written once."""

from __future__ import annotations

# Conversations whose KV stays resident between turns (LRU beyond): backends and the MAX_RESIDENT_CONVERSATIONS
# setting start from this.
DEFAULT_MAX_RESIDENT_CONVERSATIONS = 8

# Sequences an engine executor runs at once (KV slots).
DEFAULT_SEQUENCE_SLOTS = 2

# What a demo checkpoint is, when its marker gives no text of its own. Every surface (badge, status, log) shows it.
DEMO_NOTICE = "Demo model: not a medical model. Not for clinical use."

# Weight formats of the PyTorch fast path's decode step (FAST_PATH_WEIGHTS): bf16, or 8-bit weight-only with
# per-channel scales (int8, or FP8 e4m3), each behind the accuracy gate at start.
FAST_PATH_WEIGHT_FORMATS = ("bf16", "int8", "fp8")
