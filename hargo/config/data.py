"""params.yaml ``data`` and ``validate``, typed: what prepare reads and how it splits the records,
and the bounds the data checks enforce on the prepared splits (sections of :mod:`hargo.config`).
"""
from __future__ import annotations

from typing import Mapping

from hargo.config.fields import REQUIRED, knob, node
from hargo.config.knobs import _bool, _int, _str, section

__all__ = ["Split", "Data", "Validate"]


# --------------------------------------------------------------------------------------- data
@section
class Split:
    """``data.split``: how prepare splits the records into train and eval
    (hargo/data/split.py)."""

    strategy: str = _str(help="similarity: as grouped, and no race kernel with a near-copy in "
                              "both splits; grouped: no instruction text in both splits; paper: "
                              "as the paper (5,273/584)",
                         choices=("grouped", "similarity", "paper"))
    eval_fraction: float = knob(REQUIRED, "share of the records in the eval split", 0, 0.5,
                                lo_open=True)
    similarity_threshold: float = knob(REQUIRED, "race records whose prompt token sets have "
                                       "Jaccard >= this, chained, form one group kept in one "
                                       "split (similarity only; 1.0 = equal token sets)", 0, 1,
                                       lo_open=True)
    minhash_perm: int = _int(REQUIRED, "MinHash permutations for the LSH candidate pairs "
                                       "(similarity only)", 4, 1024)


@section
class Data:
    """``data``: where prepare reads the raw HPC-GPT files and writes the splits."""

    raw_dir: str = _str(help="folder of the raw HPC-GPT files")
    out_dir: str = _str(help="folder of the prepared splits (train.jsonl, eval.jsonl)")
    split: Split = node(Split, "the train/eval split")
    conflicts: str = _str(help="repeated prompts with different answers: majority keeps a "
                               "strict majority's answer, drop rejects every conflicting group",
                          choices=("majority", "drop"))
    mask_label_names: bool = _bool(True, "remove the yes/no components of DataRaceBench program "
                                         "names from race prompts (hargo/data/labels.py)")


# ----------------------------------------------------------------------------------- validate
@section
class Validate:
    """``validate``: the bounds the data checks enforce on the prepared splits."""

    task_counts: Mapping[str, tuple[int, int]] = knob(
        REQUIRED, "per task of the raw files: [min, max] records after prepare (train + eval)",
        kind="task_map", item={"kind": "int_range", "lo": 0, "hi": None})
    yes_fraction: tuple[float, float] = knob(REQUIRED, "race label balance, per task and split: "
                                             "[min, max]", 0, 1, kind="range")
    prompt_chars: tuple[int, int] = knob(REQUIRED, "[min, max] prompt characters", 0,
                                         kind="int_range")
    answer_chars: tuple[int, int] = knob(REQUIRED, "[min, max] answer characters", 0,
                                         kind="int_range")
    report_dir: str = _str("reports/validation", "folder of the validation report (GX results, "
                                                 "data docs)")
    metrics_file: str = _str("metrics/validation.json", "the validation summary")
    data_docs: bool = _bool(True, "build GX's HTML data docs (~2 s)")
