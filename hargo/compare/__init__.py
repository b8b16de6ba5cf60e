"""The nine-method comparison (issue 7): preference pairs, per-method training, evaluation, report."""
