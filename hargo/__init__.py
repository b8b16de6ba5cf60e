"""hargo: Heterogeneity-Aware Reward-Guided Optimization for RL post-training on HPC tasks."""

__version__ = "0.1.0"
