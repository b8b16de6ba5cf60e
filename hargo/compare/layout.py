"""Where the comparison's runs live and what they are called: shared by the stages that write them
(``compare_train``, ``compare_eval``) and the report that reads them, so the report depends on
these names and not on the training and generation code."""
from __future__ import annotations

from pathlib import Path

__all__ = ["EVAL_ROOT", "TRAIN_METRICS_ROOT", "SFT_RUN", "BASE_RUN", "run_name"]

#: ``data/compare/eval/<run>/``: one run's eval generations and metrics (``compare_eval``).
EVAL_ROOT = Path("data") / "compare" / "eval"
#: ``metrics/compare/train/<run>.json``: one run's training metrics (``compare_train``).
TRAIN_METRICS_ROOT = Path("metrics") / "compare" / "train"
#: The SFT model's and the untuned base model's runs (evaluated once, not per seed).
SFT_RUN = "sft"
BASE_RUN = "base"


def run_name(method: str, seed: int) -> str:
    """``"<method>-s<seed>"``: the name of one comparison run (folders, MLflow runs)."""
    return f"{method}-s{int(seed)}"
