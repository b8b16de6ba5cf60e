"""Loading and checking ``params.yaml``: the one place the pipeline's knobs live.

Both doors into the pipeline (``dvc repro`` through the CLI, and the Prefect flows) load params
here, apply per-run overrides (``"rl.hargo.beta=0.04"`` style, as ``dvc exp run -S``) and validate
them *before* any work starts, so that a bad value fails fast with the parameter's dotted name.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from hargo.param_values import ParamsError, as_number  # noqa: F401  (public here too)
from hargo.methods import RL_FAMILIES, get_method
from hargo.methods import methods as all_methods
from hargo.tasks import task_names, tasks


class ParamsLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's float syntax: PyYAML follows YAML 1.1, which reads
    ``1e-5`` and ``1e-05`` (what ``dvc exp run -S`` writes) as *strings*; here every float
    spelling YAML 1.2 allows (``1e-5``, ``1E-5``, ``1e-05``, ``.5``, ``5.0e-5``, ``+1.5``,
    ``.inf``, ``.nan``) is a float."""


ParamsLoader.yaml_implicit_resolvers = {
    k: [(tag, rx) for tag, rx in v if tag != "tag:yaml.org,2002:float"]
    for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
ParamsLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
                  |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
                  |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
                  |[-+]?\.(?:inf|Inf|INF)
                  |\.(?:nan|NaN|NAN))$""", re.X),
    list("-+0123456789."))

def get(params: Mapping, dotted: str) -> Any:
    """Return ``params["a"]["b"]`` for ``dotted == "a.b"``.

    Raises:
        ParamsError: a key on the path is missing.
    """
    cur: Any = params
    for i, key in enumerate(dotted.split(".")):
        if not isinstance(cur, Mapping) or key not in cur:
            raise ParamsError(f"{dotted}: missing (no key '{'.'.join(dotted.split('.')[:i + 1])}')")
        cur = cur[key]
    return cur


def apply_overrides(params: dict, overrides: Mapping[str, Any] | Iterable[str] | None) -> dict:
    """Return a copy of ``params`` with overrides applied.

    ``overrides`` is a mapping ``{"rl.method": "hargo"}`` or strings ``"rl.steps=8"`` whose values
    are parsed as YAML (so ``8`` is an int, ``[grpo, hargo]`` a list). Only existing keys can be
    overridden, so a typo fails instead of being silently ignored.

    Raises:
        ParamsError: an override names a key that params.yaml does not have, or is malformed.
    """
    out = copy.deepcopy(params)
    if not overrides:
        return out
    if not isinstance(overrides, Mapping):
        parsed = {}
        for item in overrides:
            if "=" not in item:
                raise ParamsError(f"override '{item}': expected KEY=VALUE")
            k, v = item.split("=", 1)
            parsed[k.strip()] = yaml.safe_load(v)
        overrides = parsed
    for dotted, value in overrides.items():
        keys = dotted.split(".")
        cur = out
        for i, key in enumerate(keys[:-1]):
            if not isinstance(cur.get(key), dict):
                raise ParamsError(f"{dotted}: unknown parameter (no section "
                                  f"'{'.'.join(keys[:i + 1])}' in params.yaml)")
            cur = cur[key]
        if keys[-1] not in cur:
            raise ParamsError(f"{dotted}: unknown parameter (not in params.yaml)")
        cur[keys[-1]] = value
    return out


#: The output of the ``params`` stage (dvc.yaml's first stage; ``hargo check-params``).
CHECKED_STAMP = "reports/params-valid.txt"
#: Its content, the same for every valid params.yaml: a valid change re-runs only the stages
#: that read the changed keys, never the stages downstream of the stamp as such.
CHECKED_TEXT = ("params.yaml passed hargo.params.validate_params; every stage of dvc.yaml and "
                "compare/dvc.yaml depends on this file\n")


def write_checked_stamp(params_path: str | Path = "params.yaml", root: str | Path = ".") -> Path:
    """The ``params`` stage: validate ``params_path`` (:func:`load_params`), then write
    :data:`CHECKED_STAMP` under ``root``. Returns the stamp's path.

    Every other stage depends on the stamp, so ``dvc repro`` and ``dvc exp run -S key=value``
    run this stage first: DVC deletes a stage's outputs just before running it, so a value that
    fails here stops the run before any stage's outputs are touched (DVC already removed the
    stamp itself, which makes the next ``dvc repro`` check again).

    Raises:
        FileNotFoundError: ``params_path`` does not exist.
        ParamsError: the first invalid key, by name (:func:`validate_params`).
    """
    from hargo.io import atomic_write_text

    load_params(Path(root) / params_path)
    return atomic_write_text(Path(root) / CHECKED_STAMP, CHECKED_TEXT)


#: The range a learning rate is plausible in, for full fine-tuning and LoRA alike (the paper's
#: SFT uses 2e-5, LoRA recipes 1e-4 to 2e-4, the tiny synthetic policy 1e-3); outside it
#: ``check-params`` warns, since a run at 1e3 diverges at its second step.
PLAUSIBLE_LEARNING_RATE = (1e-7, 1e-2)


def implausible_learning_rates(params: Mapping) -> list[str]:
    """One warning per ``*learning_rate`` parameter outside :data:`PLAUSIBLE_LEARNING_RATE`,
    naming the key, its value and the range (empty: all plausible)."""
    lo, hi = PLAUSIBLE_LEARNING_RATE
    out = []

    def walk(d, prefix):
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, Mapping):
                walk(v, key + ".")
            elif str(k).endswith("learning_rate") and isinstance(v, (int, float)) \
                    and not isinstance(v, bool) and not lo <= v <= hi:
                out.append(f"{key} = {v:g} is outside the plausible range [{lo:g}, {hi:g}]; "
                           "a run may diverge (train.divergence stops it) or not move")

    walk(params, "")
    return out


def load_params(path: str | Path = "params.yaml",
                overrides: Mapping[str, Any] | Iterable[str] | None = None) -> dict:
    """Load ``path``, apply ``overrides`` and validate.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        ParamsError: see :func:`validate_params`.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: params file not found (run from the repository root)")
    with path.open(encoding="utf-8") as f:
        params = yaml.load(f, Loader=ParamsLoader) or {}
    params = apply_overrides(params, overrides)
    validate_params(params)
    return params


def _set(params, key, value) -> None:
    *head, last = key.split(".")
    cur = params
    for k in head:
        cur = cur[k]
    cur[last] = value


def _num(params, key, lo=None, hi=None, integer=False, lo_open=False, allow_none=False):
    """Check a numeric parameter (any spelling, see :func:`as_number`) and its range, and
    store it back as a number."""
    raw = get(params, key)
    if raw is None and allow_none:
        return
    v = as_number(key, raw, integer)
    if v is not raw:
        _set(params, key, v)
    if lo is not None and (v <= lo if lo_open else v < lo):
        raise ParamsError(f"{key}: must be {'>' if lo_open else '>='} {lo}, got {v!r}")
    if hi is not None and v > hi:
        raise ParamsError(f"{key}: must be <= {hi}, got {v!r}")


#: characters a generated token may take, at most, for the degenerate-answer budget check
#: (SmolLM2's BPE averages ~4 characters a token on the HPC-GPT answers).
CHARS_PER_TOKEN_BOUND = 8


def _answer_budgets(params):
    """Each task's ``rewards.answer.max_chars`` must leave room for what its generation budgets
    can produce (``CHARS_PER_TOKEN_BOUND`` characters a token), so that no honest completion is
    degenerate by length (``hargo.rewards.text``)."""
    from hargo.generation_budget import task_budget

    for task in _char_budget_tasks(params):
        have = get(params, f"rewards.answer.max_chars.{task}")
        for key in ("rl.max_new_tokens", "evaluate.max_new_tokens",
                    "compare.evaluate.max_new_tokens"):
            raw = get(params, key)
            if raw is None:
                continue
            tokens = task_budget(raw, task, key)
            need = CHARS_PER_TOKEN_BOUND * tokens
            if have < need:
                raise ParamsError(
                    f"rewards.answer.max_chars.{task}: {have} characters is less than {key} "
                    f"allows ({tokens} tokens x {CHARS_PER_TOKEN_BOUND}); "
                    f"raise it to >= {need}, or an honest long answer would count as degenerate")


def _params_tuned() -> list[str]:
    """The registered tasks without budget defaults of their own (the HPC-GPT tasks): every
    per-task map of params.yaml must name them."""
    return [t.name for t in tasks() if t.max_new_tokens is None]


def _char_budget_tasks(params) -> list[str]:
    """The tasks with a ``rewards.answer.max_chars`` entry: every :func:`_params_tuned` task
    (required) and any other registered task the map names (a task it does not name has no
    character budget: ``hargo.rewards.text.degenerate``)."""
    given = get(params, "rewards.answer.max_chars")
    named = given if isinstance(given, Mapping) else {}
    return [t for t in task_names() if t in _params_tuned() or t in named]


def _task_keys(params, key) -> None:
    """The per-task map ``key`` names only registered tasks.

    Raises:
        ParamsError: not a mapping, or a key that is not a registered task (named
            ``<key>.<task>``, with the valid tasks)."""
    value = get(params, key)
    if not isinstance(value, Mapping):
        raise ParamsError(f"{key}: expected one entry per task, got {value!r}")
    for t in value:
        if t not in task_names():
            raise ParamsError(f"{key}.{t}: unknown task {t!r}; valid tasks: "
                              f"{', '.join(task_names())}")


def _budget(params, key):
    """A completion budget or a prompt cap: an integer >= 1, or one per registered task (a task
    with its own default may be left out: :func:`hargo.generation_budget.check_budget`)."""
    from hargo.generation_budget import check_budget

    raw = get(params, key)
    if isinstance(raw, str) or isinstance(raw, float):   # "16", 16.0: a number's other spellings
        _num(params, key, 1, integer=True)
        return
    check_budget(raw, key, task_names())


def _known_method(key: str, name: Any, families: tuple[str, ...] = ()) -> None:
    """``name`` is a registered method (of ``families`` when given); the error names ``key``
    and lists the valid methods (:func:`hargo.methods.get_method`)."""
    try:
        get_method(name, *families)
    except ParamsError as e:
        raise ParamsError(f"{key}: {e}") from None


#: ``rl.generation_backend``: TRL's transformers generation, its colocated vLLM engine, or a vLLM
#: server started apart (``rl.vllm_server``; hargo/training/vllm_rollout.py).
GENERATION_BACKENDS = ("transformers", "vllm", "vllm-server")


def _vllm_server(params):
    """``rl.vllm_server`` (``{host, port, timeout}``): required when ``rl.generation_backend`` is
    ``vllm-server``, checked whenever present. ``host`` a non-empty name or address without a
    scheme, ``port`` an integer 1-65535, ``timeout`` seconds > 0; any other key is refused."""
    from hargo.training.vllm_rollout import SERVER_KEYS

    server = get(params, "rl").get("vllm_server")
    if server is None:
        if get(params, "rl.generation_backend") == "vllm-server":
            raise ParamsError("rl.vllm_server: required when rl.generation_backend is "
                              f"'vllm-server' ({', '.join(SERVER_KEYS)})")
        return
    if not isinstance(server, Mapping):
        raise ParamsError(f"rl.vllm_server: expected a mapping of {', '.join(SERVER_KEYS)}, "
                          f"got {server!r}")
    for key in server:
        if key not in SERVER_KEYS:
            raise ParamsError(f"rl.vllm_server.{key}: unknown key; valid: {', '.join(SERVER_KEYS)}")
    host = get(params, "rl.vllm_server.host")
    if not isinstance(host, str) or not host.strip() or "/" in host or \
            (":" in host and not host.startswith("[")):     # IPv6: [::1]
        raise ParamsError(f"rl.vllm_server.host: expected a host name or address (no scheme, "
                          f"port or path), got {host!r}")
    _num(params, "rl.vllm_server.port", 1, 65535, integer=True)
    _num(params, "rl.vllm_server.timeout", 0, lo_open=True)


def _choice(params, key, choices):
    v = get(params, key)
    if v not in choices:
        raise ParamsError(f"{key}: must be one of {', '.join(map(str, choices))}; got {v!r}")


def _range(params, key, lo=None, hi=None, integer=False):
    v = get(params, key)
    if not isinstance(v, list) or len(v) != 2:
        raise ParamsError(f"{key}: expected [min, max], got {v!r}")
    for i, x in enumerate(v):
        kind = int if integer else (int, float)
        if isinstance(x, bool) or not isinstance(x, kind):
            raise ParamsError(f"{key}: expected [min, max] of numbers, got {v!r}")
        if (lo is not None and x < lo) or (hi is not None and x > hi):
            raise ParamsError(f"{key}: bounds must lie in [{lo}, {hi}], got {v!r}")
    if v[0] > v[1]:
        raise ParamsError(f"{key}: min {v[0]} is above max {v[1]}")


def validate_params(params: Mapping) -> None:
    """Check every parameter the stages use, before any of them runs.

    Raises:
        ParamsError: naming the first bad parameter by its dotted path, e.g.
            ``rl.num_generations: must be >= 2, got 1``.
    """
    _num(params, "seed", 0, integer=True)
    _choice(params, "data.split.strategy", ("grouped", "similarity", "paper"))
    _num(params, "data.split.eval_fraction", 0, 0.5, lo_open=True)
    _num(params, "data.split.similarity_threshold", 0, 1, lo_open=True)
    _num(params, "data.split.minhash_perm", 4, 1024, integer=True)
    _choice(params, "data.conflicts", ("majority", "drop"))
    if not isinstance(get(params, "data.mask_label_names"), bool):
        raise ParamsError(f"data.mask_label_names: expected true or false, "
                          f"got {get(params, 'data.mask_label_names')!r}")
    _task_keys(params, "validate.task_counts")
    for task in (t.name for t in tasks() if t.raw_file):    # the tasks of the raw files
        _range(params, f"validate.task_counts.{task}", 0, integer=True)
    _range(params, "validate.yes_fraction", 0, 1)
    _range(params, "validate.prompt_chars", 0, integer=True)
    _range(params, "validate.answer_chars", 0, integer=True)
    for key in ("format_bonus", "length_penalty", "min_reward"):
        _num(params, f"rewards.plp.{key}", None if key == "min_reward" else 0)
    _num(params, "rewards.plp.length_budget", 0, integer=True)
    _num(params, "rewards.plp.batch_size", 1, integer=True)
    for key in ("partial", "overlap_high", "overlap_high_reward", "overlap_low",
                "overlap_low_reward"):
        _num(params, f"rewards.mlperf.{key}", 0, 1)
    _task_keys(params, "rewards.answer.max_chars")
    for task in _char_budget_tasks(params):
        _num(params, f"rewards.answer.max_chars.{task}", 1, integer=True)
    _num(params, "rewards.answer.degenerate_scale", 0, 1)
    if get(params, "rewards.answer.degenerate_scale") == 1:
        raise ParamsError("rewards.answer.degenerate_scale: must be < 1 (a degenerate answer "
                          "earns less than the plain one), got 1")
    _num(params, "rewards.answer.repetition_ngram", 1, integer=True)
    _num(params, "rewards.answer.repetition_min_distinct", 0, 1, lo_open=True)
    _num(params, "rewards.answer.repetition_max_char_run", 1, integer=True)
    _choice(params, "model.dtype", ("float32", "bfloat16", "float16"))
    if not isinstance(get(params, "model.source"), str) or not get(params, "model.source"):
        raise ParamsError(f"model.source: expected 'smollm2', a hub id or a folder; "
                          f"got {get(params, 'model.source')!r}")
    if not isinstance(get(params, "model.trust_remote_code"), bool):
        raise ParamsError("model.trust_remote_code: expected true or false")
    if get(params, "train.threads") != "auto":
        _num(params, "train.threads", 0, integer=True)
    _num(params, "train.max_prompt_tokens", 1, integer=True)
    for key in ("max_loss", "max_kl", "max_grad_norm"):
        _num(params, f"train.divergence.{key}", 0, lo_open=True)
    for sec in ("sft", "rl"):
        _num(params, f"{sec}.learning_rate", 0, lo_open=True)
        _num(params, f"{sec}.samples_per_task", 1, integer=True, allow_none=True)
        _num(params, f"{sec}.lora.r", 1, integer=True)
        _num(params, f"{sec}.lora.alpha", 0, lo_open=True)
        _num(params, f"{sec}.lora.dropout", 0, 1)
    if "adapter_dtype" in get(params, "rl.lora"):
        _choice(params, "rl.lora.adapter_dtype", ("float32", "bfloat16"))
    _num(params, "sft.batch_size", 1, integer=True)
    _num(params, "sft.grad_accum", 1, integer=True)
    _num(params, "sft.epochs", 0, lo_open=True)
    _num(params, "sft.max_steps", -1, integer=True)
    _num(params, "sft.max_length", 16, integer=True)
    _num(params, "sft.length_bucket_batches", 0, integer=True)
    methods = get(params, "rl.methods")
    if not isinstance(methods, list) or not methods:
        raise ParamsError(f"rl.methods: expected a non-empty list, got {methods!r}")
    for m in methods:
        _known_method("rl.methods", m, RL_FAMILIES)
    if len(set(methods)) != len(methods):
        raise ParamsError(f"rl.methods: duplicate method in {methods}")
    _num(params, "rl.num_generations", 2, integer=True)
    _num(params, "rl.steps", 1, integer=True)
    _num(params, "rl.prompts_per_step", 1, integer=True)
    _budget(params, "rl.max_new_tokens")
    if get(params, "rl").get("max_prompt_tokens") is not None:
        _budget(params, "rl.max_prompt_tokens")     # one cap, or one per task
    _num(params, "rl.temperature", 0, lo_open=True)
    _num(params, "rl.clip_range", 0, 1, lo_open=True)
    for m in all_methods():   # every method's own block (rl.<method>), in use or not
        if m.params_class is not None:
            m.read_params(params)
    _num(params, "rl.save_steps", 1, integer=True)
    from hargo.training.dynamic_sampling import DynamicSamplingConfig

    DynamicSamplingConfig.from_params(get(params, "rl").get("dynamic_sampling"))
    _choice(params, "rl.generation_backend", GENERATION_BACKENDS)
    _vllm_server(params)
    _choice(params, "evaluate.backend", ("vllm", "transformers"))
    _num(params, "evaluate.samples_per_task", 1, integer=True, allow_none=True)
    _budget(params, "evaluate.max_new_tokens")
    _num(params, "evaluate.temperature", 0)
    _num(params, "evaluate.max_prompt_tokens", 1, integer=True)
    _num(params, "evaluate.batch_size", 1, integer=True)
    _num(params, "evaluate.kv_cache_gib", 0, lo_open=True)
    _num(params, "evaluate.gpu_memory_utilization", 0, 1, lo_open=True)
    _choice(params, "evaluate.dtype", ("auto", "float32", "bfloat16", "float16"))
    _choice(params, "evaluate.judge", ("reward", "llm"))
    if get(params, "evaluate.judge") == "llm" and not get(params, "evaluate.judge_endpoint"):
        raise ParamsError("evaluate.judge_endpoint: required when evaluate.judge is 'llm'")
    if "compare" in params:
        _validate_compare(params)
    if "synthetic" in params:                    # the synthetic test bed's own plan
        from hargo.compare.synthetic_plan import plan as synthetic_plan

        synthetic_plan(params)
    _num(params, "register.tolerance", 0)        # any number spelling -> a number
    from hargo.gate import check_gate_params     # the gate's own rule, one definition

    try:
        check_gate_params(get(params, "register"))
    except ValueError as e:
        raise ParamsError(str(e)) from None


def validate_preferences(params: Mapping) -> None:
    """``compare.preferences``: ``samples_per_task`` an integer >= 1 or null (all);
    ``samples_per_prompt`` an integer >= 2 (a pair needs two samples); ``temperature`` > 0
    (greedy samples would always tie); ``max_new_tokens`` an integer >= 1; ``backend`` vllm or
    transformers.

    Raises:
        ParamsError: naming the first bad key by its dotted path.
    """
    _num(params, "compare.preferences.samples_per_task", 1, integer=True, allow_none=True)
    _num(params, "compare.preferences.samples_per_prompt", 2, integer=True)
    _num(params, "compare.preferences.temperature", 0, lo_open=True)
    _num(params, "compare.preferences.max_new_tokens", 1, integer=True)
    _choice(params, "compare.preferences.backend", ("vllm", "transformers"))


def _validate_compare(params: Mapping) -> None:
    """The ``compare`` section (the nine-method comparison)."""
    for key in ("compare.methods", "compare.seeds"):
        v = get(params, key)
        if not isinstance(v, list) or not v:
            raise ParamsError(f"{key}: expected a non-empty list, got {v!r}")
        if len(set(map(str, v))) != len(v):
            raise ParamsError(f"{key}: duplicate entry in {v}")
        for x in v:
            if key == "compare.methods":
                _known_method(key, x)
            elif not isinstance(x, int) or isinstance(x, bool) or x < 0:
                raise ParamsError(f"{key}: seeds must be integers >= 0, got {x!r}")
    _num(params, "compare.samples_per_task", 1, integer=True, allow_none=True)
    _num(params, "compare.steps", 1, integer=True)
    _num(params, "compare.prompts_per_step", 1, integer=True)
    validate_preferences(params)
    for m in all_methods():     # the preference methods' and hpcgpt's compare.<method> blocks
        for key, rule in m.param_rules:
            _num(params, f"{m.params_block}.{key}", **rule)
    _num(params, "compare.evaluate.samples_per_task", 1, integer=True, allow_none=True)
    _budget(params, "compare.evaluate.max_new_tokens")
    _answer_budgets(params)
    _num(params, "compare.report.bootstrap_resamples", 100, integer=True)
    _num(params, "compare.report.confidence", 0, 1, lo_open=True)
