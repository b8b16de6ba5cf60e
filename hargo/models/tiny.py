"""A tiny policy built from a config: a random Llama of a few million parameters, with either
the project's tokenizer (SmolLM2's, 49,152 tokens) or a small byte-level BPE tokenizer trained
on the texts it will see (the synthetic test bed, :mod:`hargo.compare.synthetic`).

Why a small tokenizer: with SmolLM2's vocabulary the tied embedding and the output softmax
(49,152 x hidden) dominate a tiny model's parameters and its CPU time (every position computes
49,152 logits); a 512-token BPE trained on the synthetic prompts and answers makes the same
network ~10x cheaper per step and leaves its parameters to the layers.

Both tokenizers use ChatML (``<|im_start|>role\\n...<|im_end|>\\n``), so TRL's SFT and GRPO
trainers and hargo's generation code treat the tiny policy exactly like the real model. The
small tokenizer's chat template has no default system prompt (SmolLM2's adds one).
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from hargo.config.synthetic import SyntheticPolicy

__all__ = ["TinyPolicyConfig", "CHATML_TEMPLATE", "SPECIAL_TOKENS", "train_small_tokenizer",
           "build_tiny_policy"]

#: ChatML without a default system prompt (the roles' texts exactly as given).
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
#: The small tokenizer's special tokens: padding, ChatML's turn markers (``<|im_end|>`` is EOS).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


#: The tiny policy's architecture: params.yaml ``synthetic.policy``, the typed config's block
#: (:class:`hargo.config.synthetic.SyntheticPolicy`: ``tokenizer``, ``vocab_size``,
#: ``hidden_size``, ``num_layers``, ``num_heads``, ``intermediate_size``, ``max_positions``, each
#: with its type, default, range and help; ``from_params`` builds one from a mapping, refusing an
#: unknown key by name; a bad value raises a ValueError naming ``synthetic.policy.<key>``).
TinyPolicyConfig = SyntheticPolicy


def train_small_tokenizer(texts: Iterable[str], vocab_size: int):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``texts`` (deterministic for the
    same texts in the same order), with :data:`SPECIAL_TOKENS`, EOS ``<|im_end|>``, padding
    ``<|endoftext|>`` and :data:`CHATML_TEMPLATE`. Any text round-trips (byte fallback).

    Raises:
        ValueError: ``vocab_size`` below 300.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 300:
        raise ValueError(f"vocab_size must be >= 300, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=int(vocab_size), special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(list(texts), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>", bos_token="<|im_start|>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = CHATML_TEMPLATE
    fast.model_max_length = 1 << 20
    return fast


def build_tiny_policy(out_dir: str | Path, config: TinyPolicyConfig, texts: Iterable[str] = (),
                      seed: int = 0) -> Path:
    """Write a random ``LlamaForCausalLM`` (fp32 safetensors, tied embedding) and its tokenizer
    to ``out_dir``, whole or not at all (:func:`hargo.io.atomic_dir`). Returns ``out_dir``.

    ``texts``: what the small tokenizer is trained on (the task prompts and answers; ignored
    for ``tokenizer="project"``). Deterministic per (config, texts, seed).

    Raises:
        ValueError: ``tokenizer="small"`` and no texts.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from hargo.io import atomic_dir

    if config.tokenizer == "small":
        texts = list(texts)
        if not texts:
            raise ValueError("build_tiny_policy: the small tokenizer needs texts to train on")
        tok = train_small_tokenizer(texts, config.vocab_size)
    else:
        from hargo.models.smollm2 import load_tokenizer

        tok = load_tokenizer()
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    arch = LlamaConfig(
        vocab_size=len(tok), hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size, num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads, num_key_value_heads=config.num_heads,
        max_position_embeddings=config.max_positions, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=pad,
    )
    with torch.random.fork_rng(devices=[]):   # seeded init, the caller's RNG left as it was
        torch.manual_seed(int(seed))
        model = LlamaForCausalLM(arch).to(torch.float32)
    model.generation_config.pad_token_id = pad
    model.generation_config.eos_token_id = tok.eos_token_id
    with atomic_dir(Path(out_dir)) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
    return Path(out_dir)
