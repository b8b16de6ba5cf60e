"""Tiny models and crafted data for tests and smoke runs: a random Llama built from a config,
and short prepared records of the four tasks (:func:`crafted_records`).

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


def crafted_record(i: int, task: str, content: str, answer: str, label: str | None = None,
                   source_file: str = "crafted.json", id_prefix: str = "") -> dict:
    """One prepared record (the schema of :func:`hargo.data.raw.make_record`) with a single
    user turn ``content``: id ``f"{id_prefix}{task}-{i:05d}"``, source ``{source_file, i}``."""
    return {"id": f"{id_prefix}{task}-{i:05d}", "task": task,
            "prompt": [{"role": "user", "content": content}], "answer": answer, "label": label,
            "alt_answers": [], "source": {"file": source_file, "index": i}}


def crafted_records(per_task: int, start: int = 0, source_file: str = "crafted.json",
                    id_prefix: str = "") -> list[dict]:
    """``per_task`` short prepared records for each of the four tasks, numbered ``start`` ..
    ``start + per_task - 1`` (in that order, the four tasks for each number): race answers
    alternate yes/no, each with its label; ids and sources as :func:`crafted_record`."""
    def rec(i: int, task: str, content: str, answer: str, label: str | None = None) -> dict:
        return crafted_record(i, task, content, answer, label, source_file, id_prefix)

    out = []
    for i in range(start, start + per_task):
        yes = "yes" if i % 2 == 0 else "no"
        out.append(rec(i, "race_c", f"Is there a data race? for (i = 0; i < n; i++) a[i] = "
                       f"a[i + {i + 1}];", yes, yes))
        no = "no" if i % 2 == 0 else "yes"
        out.append(rec(i, "race_fortran", f"Is there a data race? do i = 1, n\n a(i) = b(i) + "
                       f"{i}\nend do", no, no))
        out.append(rec(i, "mlperf", f"What is the quality target of MLPerf benchmark {i}?",
                       f"{75 + i}.9%"))
        out.append(rec(i, "plp", f"Explain what '#pragma omp parallel for' does ({i}).",
                       "It splits the loop iterations across the threads of a team."))
    return out


#: A fixed rollout batch as (record fields, G=4 given completions): group 0 has one correct
#: answer of four (docs/method.md's worked check), 1 mixed mlperf answers, 2 all correct (no
#: contrast), 3 plp (the MiniLM reward).
FIXED_GROUP_SPECS: list[tuple[tuple, list[str]]] = [
    ((100, "race_c", "Is there a data race? for (i = 1; i < n; i++) a[i] = a[i - 1] + 1;",
      "yes", "yes"), ["yes", "no", "No, there is no race.", "no"]),
    ((101, "mlperf", "What is the quality target of MLPerf ResNet-50?", "75.9%"),
     ["75.9%", "The target is 75.9%", "80%", "I do not know"]),
    ((102, "race_fortran", "Is there a data race? do i = 1, n\n a(i) = 2 * a(i)\nend do",
      "no", "no"), ["no", "No.", "no", "no race: no"]),
    ((103, "plp", "Explain what '#pragma omp parallel for' does.",
      "It splits the loop iterations across the threads of a team."),
     ["It divides the loop iterations among the threads.", "It is a comment.",
      "It splits loop iterations across threads of a team.", "parallel parallel parallel"]),
]


def fixed_groups(n: int = len(FIXED_GROUP_SPECS), source_file: str = "crafted.json",
                 id_prefix: str = "") -> list[tuple[dict, list[str]]]:
    """The first ``n`` groups of :data:`FIXED_GROUP_SPECS` as ``(record, completions)``, records
    built by :func:`crafted_record` with ``source_file`` and ``id_prefix``."""
    return [(crafted_record(*fields, source_file=source_file, id_prefix=id_prefix),
             list(completions)) for fields, completions in FIXED_GROUP_SPECS[:n]]
