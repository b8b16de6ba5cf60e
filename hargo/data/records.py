"""The prepared splits as every stage reads them: one reader, one check, one subset rule.

``prepare`` writes ``data/prepared/{train,eval}.jsonl``; SFT, RL, the preference pairs, the
evaluation and the comparison report read them through :func:`read_prepared` and draw their
subsets with :func:`select_subset`.

A prepared record (written by :mod:`hargo.data.prepare`)::

    {"id": str, "task": a registered task (hargo.tasks.task_names),
     "prompt": [{"role": str, "content": str}, ...],   # TRL conversational format
     "answer": str, "label": "yes" | "no" | None,        # label on race tasks only
     "alt_answers": [str, ...], "source": {"file": str, "index": int}}

The rule for over-long inputs (``train.max_prompt_tokens``, ``rl.max_prompt_tokens``,
``evaluate.max_prompt_tokens``): a prompt longer than the limit, counted in tokens of the
chat-templated prompt with the generation prompt appended, is *skipped and counted*, never
truncated, so no step can run out of memory on a 250k-character kernel.
"""
from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path
from typing import Mapping, Sequence

from hargo.io import HargoInputError, read_jsonl
from hargo.tasks import get_task, task_names

__all__ = ["read_prepared", "check_prepared", "select_subset", "prompt_tokens",
           "MAX_CHARS_PER_TOKEN"]

# A token of SmolLM2's (byte-level BPE) tokenizer spans 3-4 characters of code on average and
# rarely more than 8; a prompt longer than this many characters per allowed token is skipped
# without tokenising it (so a 250k-character kernel is never tokenised in full).
MAX_CHARS_PER_TOKEN = 8


def _label_ok(label) -> bool:
    return isinstance(label, str) and label.strip().lower() in ("yes", "no")


def check_prepared(path: str | Path, records: Sequence[Mapping], *,
                   require_answer: bool = False) -> None:
    """Check prepared records; the first bad one raises.

    Every record needs ``id`` (a non-empty string, unique in the file), ``task`` (a registered
    HPC-GPT task: :func:`hargo.tasks.task_names`), ``prompt`` (a non-empty list of ``{"role", "content"}`` messages
    with string role and content), ``label`` yes/no (any case) on labelled (race) tasks and a
    string ``answer`` on the others; with ``require_answer`` (SFT trains on it) a non-empty ``answer``
    on every record.

    Raises:
        HargoInputError: no records, or a record breaking the above; the message names the
            file, the record index, its id where it has one, and the field.
    """
    if not records:
        raise HargoInputError(path, "no records: the split is empty")
    seen: set[str] = set()
    for i, r in enumerate(records):
        if not isinstance(r, Mapping):
            raise HargoInputError(path, f"expected a JSON object, got {type(r).__name__}", i)
        rid = r.get("id")
        if not isinstance(rid, str) or not rid:
            raise HargoInputError(path, f"expected a non-empty string id, got {rid!r}", i, "id")
        if rid in seen:
            raise HargoInputError(path, f"duplicate id {rid!r}", i, "id")
        seen.add(rid)
        task = r.get("task")
        known = task_names()
        if task not in known:
            raise HargoInputError(path, f"record {rid!r}: unknown task {task!r}; valid: "
                                  f"{', '.join(known)}", i, "task")
        labelled = get_task(task).labelled
        prompt = r.get("prompt")
        if not isinstance(prompt, list) or not prompt or not all(
                isinstance(m, Mapping) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in prompt):
            raise HargoInputError(path, f"record {rid!r}: expected a non-empty list of "
                                  "{role, content} messages", i, "prompt")
        if labelled and not _label_ok(r.get("label")):
            raise HargoInputError(path, f"record {rid!r}: race label must be 'yes' or 'no', "
                                  f"got {r.get('label')!r}", i, "label")
        answer = r.get("answer")
        if not isinstance(answer, str) and (require_answer or not labelled):
            raise HargoInputError(path, f"record {rid!r}: expected a string answer, got "
                                  f"{answer!r}", i, "answer")
        if require_answer and not answer.strip():
            raise HargoInputError(path, f"record {rid!r}: expected a non-empty answer string",
                                  i, "answer")


def read_prepared(path: str | Path, *, require_answer: bool = False) -> list[dict]:
    """Read a prepared split and check it (:func:`check_prepared`).

    Raises:
        HargoInputError: the file is missing (the message says to run the prepare stage), a line
            is not JSON, or a record is bad.
    """
    path = Path(path)
    if not path.exists():
        raise HargoInputError(path, "split not found; run the prepare stage (hargo prepare, "
                              "or `dvc repro prepare`)")
    records = read_jsonl(path)
    check_prepared(path, records, require_answer=require_answer)
    return records


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


def _default_cap(task: str) -> int | None:
    """The registered ``task``'s default prompt cap (None: none, or not a registered task)."""
    from hargo.tasks import UnknownTaskError

    try:
        return get_task(task).max_prompt_tokens
    except UnknownTaskError:
        return None


def select_subset(records: Sequence[dict], per_task: int | None, seed: int, tokenizer,
                  max_prompt_tokens: int | Mapping[str, int]) -> tuple[list[dict], dict[str, int]]:
    """Drop over-long prompts, then draw a seeded, task-balanced sample.

    1. A record whose prompt is longer than its task's cap (see :func:`prompt_tokens`) is
       skipped and counted under its task. ``max_prompt_tokens`` is one cap for every task or a
       mapping task -> cap (e.g. Fortran kernels are ~2x longer than C kernels in tokens); a
       task the mapping does not name gets its own default cap
       (``hargo.tasks.Task.max_prompt_tokens``).
       Prompts over ``MAX_CHARS_PER_TOKEN * cap`` characters are skipped without tokenising them.
    2. Per task, ``per_task`` records are drawn without replacement from the kept ones with
       ``random.Random(f"{seed}:{task}")`` (all kept records when ``per_task`` is None or larger
       than what is left).
    3. The union is shuffled with ``random.Random(seed)``, so tasks are interleaved.

    Before 1, the prompt contents and answer of every record have ``tokenizer``'s special-token
    strings (and the common control-token spellings) broken
    (:func:`hargo.data.control_tokens.neutralise_record`; ``prepare`` did so for the common
    spellings already), so the subset can never be tokenised into a forged chat turn; the
    input records are not modified.

    Deterministic for fixed inputs and seed. Returns ``(subset, skipped)`` where ``skipped``
    maps every task seen in ``records`` (sorted) to its number of skipped records (0 included).
    Records need ``task`` and ``prompt`` (a list of ``{"role", "content"}``).

    Raises:
        ValueError: a mapping without a cap for a task of ``records`` that has no default cap
            (names the task).
    """
    if isinstance(max_prompt_tokens, Mapping):
        missing = sorted(t for t in {r["task"] for r in records}
                         if t not in max_prompt_tokens and _default_cap(t) is None)
        if missing:
            raise ValueError(f"max_prompt_tokens: no cap for task(s) {missing} (given for "
                             f"{sorted(max_prompt_tokens)})")
    from hargo.data.control_tokens import neutralise_record, special_token_strings

    by_task: dict[str, list[dict]] = defaultdict(list)
    skipped: dict[str, int] = {}
    specials = special_token_strings(tokenizer)
    for rec in records:
        rec, _ = neutralise_record(rec, specials)
        task = rec["task"]
        skipped.setdefault(task, 0)
        cap = int(max_prompt_tokens if not isinstance(max_prompt_tokens, Mapping)
                  else max_prompt_tokens[task] if task in max_prompt_tokens
                  else _default_cap(task))
        if _prompt_chars(rec["prompt"]) > MAX_CHARS_PER_TOKEN * cap or \
                prompt_tokens(tokenizer, rec["prompt"]) > cap:
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
