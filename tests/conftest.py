"""Shared test setup: make tests/ helpers and the shared benchmark suite importable."""
import os
import sys

HERE = os.path.dirname(__file__)
sys.path.insert(0, HERE)
BENCH = os.path.join(HERE, "..", "..", "shared", "bench")
if os.path.isdir(BENCH):
    sys.path.insert(0, os.path.abspath(BENCH))
