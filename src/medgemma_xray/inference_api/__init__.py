"""The token-level contract every backend implements, and its request/result types. No torch, no numpy."""
