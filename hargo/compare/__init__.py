"""The nine-method comparison: preference pairs, per-method training, evaluation, report."""
