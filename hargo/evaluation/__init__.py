"""Evaluation: generation backends (vLLM, transformers), the ``evaluate`` stage and its plots."""
