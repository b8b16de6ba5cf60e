"""Tiny models for tests and smoke runs: a random Llama built from a config.

The tokenizer is SmolLM2's (ChatML template, 49,152 tokens) read from the embedded GGUF, so the
tiny model speaks the same chat format as the real one; the network itself is 2 layers of
width 128 (~6.6M parameters, mostly the tied embedding) and runs in vLLM too (head size 64).
"""
from __future__ import annotations

from pathlib import Path


def save_tokenizer(out_dir: str | Path) -> Path:
    """Save SmolLM2's tokenizer (from the embedded GGUF) as a plain tokenizer folder."""
    from hargo.models.smollm2 import load_tokenizer

    out_dir = Path(out_dir)
    tok = load_tokenizer()
    tok.save_pretrained(out_dir)
    return out_dir


def make_tiny_model(out_dir: str | Path, tokenizer_dir: str | Path, seed: int = 0,
                    hidden_size: int = 128, num_layers: int = 2, num_heads: int = 2,
                    intermediate_size: int = 256, max_positions: int = 4096) -> Path:
    """Write a random tiny LlamaForCausalLM (fp32 safetensors) plus tokenizer to ``out_dir``.

    Deterministic for a given ``seed``. Returns ``out_dir``. The folder is marked complete (as
    :func:`hargo.io.atomic_dir` does), so stages accept it as a model folder.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads,
        num_key_value_heads=num_heads, max_position_embeddings=max_positions,
        tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out_dir, safe_serialization=True)
    tok.save_pretrained(out_dir)
    (out_dir / ".complete").write_text("ok\n")
    return out_dir
