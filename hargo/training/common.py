"""Helpers shared by the training stages (SFT and RL): torch setup (threads, seeds), LoRA config,
model/tokenizer loading, the prompt-length rule and subset selection, and whole-or-nothing saving
of merged models.

The rule for over-long inputs (issue 4, params ``train.max_prompt_tokens``): a prompt longer than
the limit, counted in tokens of the chat-templated prompt with the generation prompt appended, is
*skipped and counted*, never truncated, so that no step can run out of memory on a 250k-character
kernel.
"""
from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

from hargo.io import atomic_dir, require_complete_dir

# A token of SmolLM2's (byte-level BPE) tokenizer spans 3-4 characters of code on average and
# rarely more than 8; a prompt longer than this many characters per allowed token is skipped
# without tokenising it (so a 250k-character kernel is never tokenised in full).
MAX_CHARS_PER_TOKEN = 8

DTYPES = ("float32", "bfloat16", "float16")


def setup_torch(params: Mapping) -> int:
    """Set torch's intra-op thread count from ``train.threads`` (an integer, 0 for torch's
    default, or ``auto``: see :func:`hargo.hardware.resolve_threads`, re-checked at every call)
    and seed Python, NumPy and torch (``transformers.set_seed(params["seed"])``).

    Returns the thread count in force."""
    import torch
    from transformers import set_seed

    from hargo.hardware import resolve_threads

    threads = resolve_threads(params["train"]["threads"])
    torch.set_num_threads(threads)
    set_seed(int(params["seed"]))
    return threads


def lora_config(lora_params: Mapping):
    """A ``peft.LoraConfig`` for a causal LM from a ``sft.lora`` / ``rl.lora`` params block
    (``enabled, r, alpha, dropout, target_modules``), or ``None`` when ``enabled`` is false
    (full fine-tuning)."""
    if not lora_params.get("enabled", False):
        return None
    from peft import LoraConfig

    targets = lora_params.get("target_modules", "all-linear")
    return LoraConfig(r=int(lora_params["r"]), lora_alpha=float(lora_params["alpha"]),
                      lora_dropout=float(lora_params["dropout"]),
                      target_modules=targets if isinstance(targets, str) else list(targets),
                      bias="none", task_type="CAUSAL_LM")


def resolve_model_dir(path: str | Path) -> Path:
    """Check that ``path`` is a complete model folder written by a stage.

    Raises:
        FileNotFoundError: missing or half-written; the message names the stage to run.
    """
    path = Path(path)
    stage = {"base": "base_model (hargo base-model)", "sft": "sft (hargo sft)"}.get(
        path.name, "the stage that writes it")
    try:
        return require_complete_dir(path, what="model folder")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e} (written by stage {stage}; `dvc repro` runs it)") from None


def load_model(path: str | Path, dtype: str = "float32", trust_remote_code: bool = False):
    """Load a causal LM from a complete local model folder (see :func:`resolve_model_dir`).

    ``dtype`` is one of float32, bfloat16, float16: the weights' dtype in memory.

    Raises:
        FileNotFoundError: the folder is missing or incomplete.
        ValueError: unknown dtype.
    """
    import torch
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    path = resolve_model_dir(path)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype),
                                                trust_remote_code=trust_remote_code)


def load_tokenizer(path: str | Path):
    """Load the tokenizer of a model folder; a missing pad token is set to the EOS token.

    The padding side is left as saved; left padding for generation is the caller's business.
    """
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def _prompt_chars(messages: Sequence[Mapping]) -> int:
    return sum(len(str(m.get("content", ""))) for m in messages)


def prompt_tokens(tokenizer, prompt_messages: Sequence[Mapping]) -> int:
    """Number of tokens of ``prompt_messages`` (TRL conversational format) under the model's
    chat template with the generation prompt appended: what the model reads before answering.

    transformers 5's ``apply_chat_template(tokenize=True)`` returns a mapping, so the text is
    templated first and tokenised without extra special tokens (the template holds them).
    """
    text = tokenizer.apply_chat_template(list(prompt_messages), tokenize=False,
                                         add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def select_subset(records: Sequence[dict], per_task: int | None, seed: int, tokenizer,
                  max_prompt_tokens: int) -> tuple[list[dict], dict[str, int]]:
    """Drop over-long prompts, then draw a seeded, task-balanced sample.

    1. A record whose prompt is longer than ``max_prompt_tokens`` (see :func:`prompt_tokens`)
       is skipped and counted under its task. Prompts over ``MAX_CHARS_PER_TOKEN *
       max_prompt_tokens`` characters are skipped without tokenising them.
    2. Per task, ``per_task`` records are drawn without replacement from the kept ones with
       ``random.Random(f"{seed}:{task}")`` (all kept records when ``per_task`` is None or larger
       than what is left).
    3. The union is shuffled with ``random.Random(seed)``, so tasks are interleaved.

    Deterministic for fixed inputs and seed. Returns ``(subset, skipped)`` where ``skipped``
    maps every task seen in ``records`` (sorted) to its number of skipped records (0 included).
    Records need ``task`` and ``prompt`` (a list of ``{"role", "content"}``).
    """
    by_task: dict[str, list[dict]] = defaultdict(list)
    skipped: dict[str, int] = {}
    char_limit = MAX_CHARS_PER_TOKEN * max_prompt_tokens
    for rec in records:
        task = rec["task"]
        skipped.setdefault(task, 0)
        if _prompt_chars(rec["prompt"]) > char_limit or \
                prompt_tokens(tokenizer, rec["prompt"]) > max_prompt_tokens:
            skipped[task] += 1
            continue
        by_task[task].append(rec)
    subset: list[dict] = []
    for task in sorted(by_task):
        kept = by_task[task]
        n = len(kept) if per_task is None else min(per_task, len(kept))
        subset.extend(random.Random(f"{seed}:{task}").sample(kept, n))
    random.Random(seed).shuffle(subset)
    return subset, dict(sorted(skipped.items()))


def save_merged(model, tokenizer, out_dir: str | Path, dtype: str = "float32") -> None:
    """Save ``model`` as a plain model folder (safetensors, tokenizer, generation config).

    A PEFT model's adapters are merged into the base weights first (``merge_and_unload``), so
    vLLM and the reference model load the folder directly. The weights are cast to ``dtype``
    (the model is modified in place). Written through :func:`hargo.io.atomic_dir`: whole, with a
    ``.complete`` marker, or not at all.
    """
    import torch

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    try:
        from peft import PeftModel
    except ImportError:  # peft is a dependency; keep plain models working without it
        PeftModel = ()  # type: ignore[assignment]
    if PeftModel and isinstance(model, PeftModel):
        model = model.merge_and_unload()
    model = model.to(getattr(torch, dtype))
    model.config.use_cache = True  # trainers turn the cache off for gradient checkpointing
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)


def describe(model: Any) -> dict[str, int]:
    """``{"parameters": total, "trainable": requires_grad}`` counts of a torch model."""
    params = list(model.parameters())
    return {"parameters": sum(p.numel() for p in params),
            "trainable": sum(p.numel() for p in params if p.requires_grad)}
