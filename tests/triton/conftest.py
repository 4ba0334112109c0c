"""Triton backend tests run on CPU tensors through the interpreter: set before triton imports."""
import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, os.path.dirname(__file__))
