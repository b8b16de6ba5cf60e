"""params.yaml ``synthetic``, checked: the plan of the synthetic test bed
(:mod:`hargo.compare.synthetic`), and the paths of its stages' outputs. The plan is the typed
config's ``synthetic`` section (:class:`hargo.config.Synthetic`, whose blocks and rules are
:mod:`hargo.config.synthetic`'s): read ``p.sft.epochs``, ``p.rl.steps``,
``p.evaluate.max_new_tokens``, ``p.bootstrap.confidence``; and the stage ``synthetic_data``'s
splits read back checked (:func:`read_split`). Light imports only (no torch)."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from hargo.config import Config, Synthetic
from hargo.config.synthetic import SyntheticData
from hargo.data.synthetic import check_synthetic
from hargo.io import read_jsonl
from hargo.param_values import ParamsError

__all__ = ["CONFIGURATIONS", "SyntheticPlan", "plan", "configuration", "DATA_DIR", "MODEL_DIR",
           "RUNS_DIR", "METRICS_DIR", "REPORT_MD", "FIGURES_DIR", "read_split"]

#: The reward configurations every run of the test bed trains in.
CONFIGURATIONS: tuple[str, ...] = ("heterogeneous", "homogeneous")
#: The stages' outputs (synthetic/dvc.yaml), relative to the repository root.
DATA_DIR = Path("data") / "synthetic"
MODEL_DIR = Path("models") / "synthetic" / "sft"
RUNS_DIR = Path("checkpoints") / "synthetic"
METRICS_DIR = Path("metrics") / "synthetic"
REPORT_MD = Path("reports") / "synthetic.md"
FIGURES_DIR = Path("reports") / "synthetic"

#: The test bed's plan: the typed ``synthetic`` section (its attributes: :class:`Synthetic`).
SyntheticPlan = Synthetic


def plan(params: Config) -> Synthetic:
    """params.yaml ``synthetic`` of the typed config ``params`` (:class:`~hargo.config.Config`)
    as the typed plan. Its keys were checked when the config was built (a missing, unknown or
    bad key, a method outside the GRPO family, no seeds, an RL pool smaller than a step:
    :mod:`hargo.config.synthetic`).

    Raises:
        ParamsError: the config has no ``synthetic`` block (the section is optional).
    """
    s = params.synthetic
    if s is None:
        raise ParamsError("params.yaml has no `synthetic` block (the synthetic test bed)")
    return s


def configuration(p: Synthetic, name: str) -> SyntheticData:
    """The reward configuration ``name`` (:data:`CONFIGURATIONS`): ``p.data`` with
    ``homogeneous`` set for the control.

    Raises:
        ValueError: an unknown name.
    """
    if name not in CONFIGURATIONS:
        raise ValueError(f"unknown synthetic configuration {name!r}; valid: {list(CONFIGURATIONS)}")
    return replace(p.data, homogeneous=name == "homogeneous")


def read_split(root: Path, split: str) -> list[dict]:
    """``data/synthetic/<split>.jsonl`` under ``root``, checked.

    Raises:
        FileNotFoundError: missing (names the stage to run).
        HargoInputError: a bad record (names file, record, field).
    """
    path = root / DATA_DIR / f"{split}.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run stage synthetic_data "
                                "(dvc repro synthetic/dvc.yaml)")
    recs = read_jsonl(path)
    check_synthetic(recs, str(path))
    return recs
