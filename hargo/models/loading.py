"""Loading and saving model folders: the policy, the reference model and every stage's output.

A *model folder* is a plain transformers folder (safetensors weights, config, tokenizer,
generation config) written whole or not at all (:func:`hargo.io.atomic_dir`, a ``.complete``
marker); LoRA adapters are merged before saving, so vLLM and the reference model load the folder
directly. The rl stage also keeps its LoRA adapter in the folder's ``adapter/`` subfolder (PEFT's
own format, with the digest of the base it was trained on), which the registry stores instead of
the merged weights (:mod:`hargo.registered_models`).
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterator

from hargo.io import atomic_dir, require_complete_dir

__all__ = ["DTYPES", "ADAPTER_DIR", "ADAPTER_BASE_FILE", "resolve_model_dir", "load_model",
           "load_tokenizer", "save_merged", "cast_lora_params", "model_digest", "describe",
           "context_length", "check_context", "weights_in_dtype"]

DTYPES = ("float32", "bfloat16", "float16")
#: the subfolder of a model folder holding the LoRA adapter it was merged from (rl stage)
ADAPTER_DIR = "adapter"
#: in ``ADAPTER_DIR``: ``{"base_sha256": model_digest(base)}`` of the base the adapter was trained on
ADAPTER_BASE_FILE = "hargo_base.json"
#: the files of a model folder that make the model (weights, config, tokenizer, remote code)
_MODEL_FILE_SUFFIXES = (".safetensors", ".json", ".bin", ".jinja", ".model", ".txt", ".py")
#: hargo.training.divergence.TRAINING_RECORD (not imported: that module imports transformers)
_TRAINING_RECORD = "training_record.json"


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


def model_digest(model_dir: str | Path) -> str:
    """SHA-256 (hex) over the top-level files of a model folder that make the model (weights,
    config, tokenizer, chat template; by name and content, in name order): two folders with the
    same digest load the same model. ``adapter/``, the ``.complete`` marker and the training record
(``training_record.json``, a record of the run, not of the model) are not part of it.

    Raises:
        FileNotFoundError: ``model_dir`` is not a folder.
    """
    from hargo.io import sha256_files

    return sha256_files((p for p in Path(model_dir).iterdir()
                         if p.is_file() and p.suffix in _MODEL_FILE_SUFFIXES
                         and p.name != _TRAINING_RECORD), b"\0")


def cast_lora_params(model, dtype) -> None:
    """Cast every LoRA parameter of a PEFT ``model`` (each ``lora_*`` tensor: ``lora_A``/
    ``lora_B``, LoRA embeddings, DoRA magnitudes; never the base weights) to the torch
    ``dtype``, in place."""
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data = p.data.to(dtype)


def save_merged(model, tokenizer, out_dir: str | Path, dtype: str = "float32",
                adapter_base: str | Path | None = None, adapter_dtype: str = "float32",
                training_record: dict | None = None) -> None:
    """Save ``model`` as a plain model folder (safetensors, tokenizer, generation config).

    A PEFT model's adapters are merged into the base weights first (``merge_and_unload``), so
    vLLM and the reference model load the folder directly. The weights are cast to ``dtype``
    (the model is modified in place). Written through :func:`hargo.io.atomic_dir`: whole, with a
    ``.complete`` marker, or not at all.

    ``adapter_base``: the model folder a PEFT ``model`` was trained on; when given, ``model`` is
    a PEFT model and ``dtype`` is float32, the adapter is also kept, before merging, in
    ``out_dir/adapter`` (``PeftModel.save_pretrained``: ``adapter_config.json``,
    ``adapter_model.safetensors`` in ``adapter_dtype``) with ``hargo_base.json`` =
    ``{"base_sha256": model_digest(adapter_base)}``, so the registry can store the adapter and a
    reference to its base instead of the merged copy. With bfloat16/float16 weights no adapter
    is kept: the saved model is the merge *rounded* to that dtype (most of a small update is
    rounded away), which the adapter on the base does not reproduce, so the registry stores the
    folder's full weights, the model that was evaluated.

    ``adapter_dtype`` (``rl.lora.adapter_dtype``): ``bfloat16`` rounds every LoRA parameter
    (each ``lora_*`` tensor: ``lora_A``/``lora_B``, LoRA embeddings, DoRA magnitudes; never the
    base) to bf16 *before* both the adapter is saved and the merge, so the merged folder that
    is evaluated is exactly base + the stored adapter upcast to fp32 (PEFT's default on
    loading): half the adapter's bytes, no difference between the registered and the evaluated
    model. The rounding error is relative to the LoRA update (~2^-9 of each entry), not to the
    base weights as rounding the merge would be. Adapter tensors without ``lora_`` in their
    name (a ``modules_to_save`` copy; hargo's LoRA configs have none) keep float32, and the
    registry then refuses the mixed file by name (``hargo.registered_models``). Only the rl
    stage passes ``adapter_base``; SFT, HPC-GPT and the preference methods merge their fp32
    LoRA weights as trained.

    ``training_record``: the run's record (:func:`hargo.training.divergence.training_record`),
    written as ``training_record.json`` inside the same atomic write, so a folder never lacks
    the record it was saved with; the ``register`` stage reads it.

    Raises:
        ValueError: ``dtype`` or ``adapter_dtype`` not one of :data:`DTYPES`.
    """
    import json

    import torch

    for name, value in (("dtype", dtype), ("adapter_dtype", adapter_dtype)):
        if value not in DTYPES:
            raise ValueError(f"{name} must be one of {', '.join(DTYPES)}, got {value!r}")
    try:
        from peft import PeftModel
    except ImportError:  # peft is a dependency; keep plain models working without it
        PeftModel = ()  # type: ignore[assignment]
    is_peft = bool(PeftModel) and isinstance(model, PeftModel)
    with atomic_dir(out_dir) as tmp:
        if is_peft and adapter_base is not None and dtype == "float32":
            # rounded once; the merge below uses the same values, back in float32
            cast_lora_params(model, getattr(torch, adapter_dtype))
            model.save_pretrained(tmp / ADAPTER_DIR, safe_serialization=True)
            cast_lora_params(model, torch.float32)
            (tmp / ADAPTER_DIR / ADAPTER_BASE_FILE).write_text(
                json.dumps({"base_sha256": model_digest(adapter_base)}) + "\n")
        if is_peft:
            model = model.merge_and_unload()
        model = model.to(getattr(torch, dtype))
        model.config.use_cache = True  # trainers turn the cache off for gradient checkpointing
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        if training_record is not None:
            (tmp / _TRAINING_RECORD).write_text(json.dumps(training_record, indent=1) + "\n")


def describe(model: Any) -> dict[str, int]:
    """``{"parameters": total, "trainable": requires_grad}`` counts of a torch model."""
    params = list(model.parameters())
    return {"parameters": sum(p.numel() for p in params),
            "trainable": sum(p.numel() for p in params if p.requires_grad)}


def context_length(model_dir: str | Path) -> int | None:
    """The model's context in tokens: ``max_position_embeddings`` of ``model_dir/config.json``
    (or of its ``text_config``); None when the folder says nothing (no limit is checked then)."""
    import json

    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    v = cfg.get("max_position_embeddings") or (cfg.get("text_config") or {}).get(
        "max_position_embeddings")
    return int(v) if v else None


def check_context(limit: int | None, longest_prompt: int, new_tokens: int, prompt_param: str,
                  new_param: str) -> int:
    """Check that the longest prompt plus the completion budget fits the model's context, and
    name the parameter that is too large when it does not.

    Args:
        limit: the model's context in tokens (:func:`context_length`); None: nothing checked.
        longest_prompt: tokens of the longest prompt that will be used (after the prompt cap).
        new_tokens: the completion budget in tokens.
        prompt_param, new_param: the dotted params.yaml names of the prompt cap and of the
            completion budget, as the calling stage reads them (e.g. ``rl.max_prompt_tokens``,
            ``rl.max_new_tokens``).

    Returns:
        ``longest_prompt + new_tokens``, the context the stage needs.

    Raises:
        ValueError: ``new_tokens >= limit`` (the message names ``new_param`` only: no prompt can
            fit, whatever its length), or ``longest_prompt + new_tokens > limit`` (the message
            gives the largest value of ``prompt_param`` and of ``new_param`` that would fit).
    """
    need = longest_prompt + new_tokens
    if limit is None:
        return need
    if new_tokens >= limit:
        raise ValueError(f"{new_param}={new_tokens} leaves no room for a prompt in the model's "
                         f"context of {limit} tokens: lower {new_param} below {limit}")
    if need > limit:
        fix = f"lower {prompt_param} to at most {limit - new_tokens} (longer prompts are skipped "\
              "and counted)"
        if limit - longest_prompt >= 1:
            fix += f" or {new_param} to at most {limit - longest_prompt}"
        raise ValueError(f"the longest prompt has {longest_prompt} tokens: with {new_param}="
                         f"{new_tokens} it needs {need} tokens, past the model's context of "
                         f"{limit}; {fix}")
    return need


def _cast_bytes(model_dir: Path, target, stored: dict) -> int:
    """Bytes :func:`weights_in_dtype` writes for ``model_dir``: every floating tensor of its
    ``*.safetensors`` at ``target``'s item size, the other tensors as stored, the other
    top-level files as they are (an upper bound: safetensors' headers are left out)."""
    import math

    from safetensors import safe_open

    total = 0
    for p in model_dir.iterdir():
        if not p.is_file() or p.name.startswith("."):
            continue
        if p.suffix != ".safetensors":
            total += p.stat().st_size
            continue
        with safe_open(str(p), "pt") as f:
            for key in f.keys():
                sl = f.get_slice(key)
                size = (target.itemsize if stored.get(sl.get_dtype()) is not None
                        else _INT_BYTES.get(sl.get_dtype(), 8))   # not a float: as stored
                total += math.prod(sl.get_shape()) * size
    return total


# safetensors' names of the non-float dtypes and their item sizes (bytes)
_INT_BYTES = {"I64": 8, "U64": 8, "I32": 4, "U32": 4, "I16": 2, "U16": 2, "I8": 1, "U8": 1,
              "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


@contextlib.contextmanager
def weights_in_dtype(model_dir: str | Path, dtype: str) -> Iterator[Path]:
    """A model folder whose floating-point weights are stored in ``dtype``.

    vLLM serves a model in one dtype (``evaluate.dtype``, bf16 where the CPU or GPU has it) and
    warns once per tensor ("Attempted to load weight ... with dtype torch.float32 into parameter
    with dtype torch.bfloat16", vllm ``model_executor/models/utils.py``: 272 lines for
    SmolLM2-135M) when the folder holds another, as hargo's float32 model folders do
    (``model.dtype``). Here the weights are cast before vLLM sees them, so the warning has no
    cause; the cast is torch's round-to-nearest-even, the same rounding vLLM's own copy into a
    bf16 parameter does, so the served model is the same.

    Yields ``model_dir`` itself when every floating tensor of its ``*.safetensors`` files is
    already ``dtype`` (or it has none); otherwise a temporary folder (removed on exit) with the
    cast ``*.safetensors``, ``config.json``'s ``dtype``/``torch_dtype`` set to ``dtype``, and
    every other top-level file copied (subfolders such as ``adapter/`` and hidden files such as
    the ``.complete`` marker are left out).

    Raises:
        ValueError: ``dtype`` is not one of :data:`DTYPES`.
        FileNotFoundError: ``model_dir`` is not a folder.
        hargo.diskspace.NotEnoughSpace: the temporary folder's file system (``TMPDIR``) has
            less room than the cast copy needs (its tensors in ``dtype`` plus the other files),
            checked before anything is written.
    """
    import json
    import shutil
    import tempfile

    import torch
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model folder {model_dir} does not exist")
    target = getattr(torch, dtype)
    stored = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
              "F64": torch.float64}
    shards = sorted(model_dir.glob("*.safetensors"))
    needs_cast = False
    for shard in shards:
        with safe_open(str(shard), "pt") as f:
            for key in f.keys():
                t = stored.get(f.get_slice(key).get_dtype())
                if t is not None and t != target:
                    needs_cast = True
                    break
        if needs_cast:
            break
    if not needs_cast:
        yield model_dir
        return
    from hargo.diskspace import require_free

    require_free(tempfile.gettempdir(), _cast_bytes(model_dir, target, stored),
                 f"the {dtype} copy of {model_dir} that vLLM loads")
    with tempfile.TemporaryDirectory(prefix=f"hargo-{dtype}-") as tmp:
        out = Path(tmp)
        for p in model_dir.iterdir():
            if not p.is_file() or p.name.startswith("."):    # e.g. the .complete marker
                continue
            if p.suffix == ".safetensors":
                with safe_open(str(p), "pt") as f:
                    metadata = f.metadata()
                tensors = {k: (v.to(target) if v.is_floating_point() else v)
                           for k, v in load_file(str(p)).items()}
                save_file(tensors, str(out / p.name), metadata=metadata)
                del tensors
            elif p.name == "config.json":
                cfg = json.loads(p.read_text(encoding="utf-8"))
                for key in ("dtype", "torch_dtype"):
                    if key in cfg:
                        cfg[key] = dtype
                (out / p.name).write_text(json.dumps(cfg, indent=2) + "\n")
            else:
                shutil.copy2(p, out / p.name)
        yield out
