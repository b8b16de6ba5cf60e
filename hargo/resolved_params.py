"""Each RL method's resolved knobs as a file DVC can depend on: ``reports/method-params/<name>.json``.

DVC's ``params:`` needs every key it lists to be in params.yaml (``MissingParamsError``), so
listing ``rl.<method>`` made every method's block compulsory in every params.yaml, and an older
file invalid the moment a method was added. The ``params`` stage writes, for every registered
RL method with a params dataclass, its block with the defaults applied
(:meth:`hargo.methods.Method.read_params`), and ``rl@<method>`` (and the comparison's and the
test bed's RL stages) depend on these files instead: a method's block may be absent, and a
change of one method's knob changes one file, so only that method re-trains. The comparison's
methods get theirs too (``compare.<name>`` blocks), so each ``compare_train`` item depends on
its own method's knobs only.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Mapping

__all__ = ["METHOD_PARAMS_DIR", "resolved_method_blocks", "write_method_blocks"]

#: Folder of the resolved blocks, relative to the project root (an output of the params stage).
METHOD_PARAMS_DIR = Path("reports") / "method-params"


def resolved_method_blocks(params: Mapping) -> dict[str, dict]:
    """name -> the resolved knobs of every registered method: an RL method's ``rl.<name>``
    block (every field, defaults applied), a compared method's ``compare.<name>`` block (the
    preference methods, hpcgpt; empty when params has no ``compare`` section), ``{}`` for a
    method with no knobs.

    Raises:
        ParamsError: a block with an unknown key or a bad value (named ``rl.<name>.<field>``).
    """
    from hargo.config import as_config
    from hargo.methods import methods

    cfg = as_config(params)
    out: dict[str, dict] = {}
    for m in methods():
        if m.is_rl:
            out[m.name] = asdict(cfg.rl.method(m.name))
        elif cfg.compare is not None and m.name in cfg.compare.blocks:
            out[m.name] = asdict(cfg.compare.method(m.name))
        else:
            out[m.name] = {}
    return out


def write_method_blocks(params: Mapping, root: str | Path = ".") -> Path:
    """Write :func:`resolved_method_blocks` to ``<root>/reports/method-params/<name>.json``
    (sorted keys, one file each, each written atomically; a file whose content would not change
    is left alone) and remove the files of methods no longer registered. Returns the folder.

    Raises:
        ParamsError: as :func:`resolved_method_blocks` (nothing is written then).
    """
    from hargo.io import atomic_write_text

    blocks = resolved_method_blocks(params)
    folder = Path(root) / METHOD_PARAMS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    for name, block in blocks.items():
        path = folder / f"{name}.json"
        text = json.dumps(block, sort_keys=True, indent=2) + "\n"
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            atomic_write_text(path, text)
    for stale in folder.glob("*.json"):
        if stale.stem not in blocks:
            stale.unlink()
    return folder
