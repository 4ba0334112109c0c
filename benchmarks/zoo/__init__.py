"""The model zoo benchmark (real model classes from transformers; see run.py)."""
