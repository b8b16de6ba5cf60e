"""The typed config a test hands a stage or a helper (they take :class:`hargo.config.Config`,
never the params mapping): the committed params.yaml with the test's own sections in place of
its, converted once (:func:`hargo.config.as_config`)."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

from hargo.config import Config, as_config
from hargo.params import read_params_file

PARAMS_YAML = Path(__file__).resolve().parents[1] / "params.yaml"


def config_with(sections: Mapping) -> Config:
    """params.yaml with each top-level section of ``sections`` (``{"seed": 7, "data": {...}}``)
    replacing its own, as the typed config.

    Raises:
        ParamsError: a bad key of ``sections`` (named by its dotted key)."""
    return as_config({**read_params_file(PARAMS_YAML), **sections})
