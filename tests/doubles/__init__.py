"""Test doubles shared by tests and benchmarks (``sparse``: checkpoints of any declared size
without their bytes)."""
