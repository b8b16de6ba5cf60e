"""Pairwise judges for the WinRate metric (method.md "WinRate"; the paper does not name its judge,
so every report names the one used: ``Judge.name``).

A judge compares a model's completion ``a`` with a baseline's completion ``b`` for the same
sample and returns ``1`` (a wins), ``0`` (tie) or ``-1`` (b wins).

- ``RewardJudge`` (name ``"task-reward"``, the default): the higher task reward wins; rewards
  within ``tol`` of each other tie.
- ``LLMJudge`` (name ``"llm:<model>"``): asks any OpenAI-compatible chat endpoint (a vLLM server,
  for instance) through plain ``urllib``. To cancel position bias it asks twice, with the two
  responses in both orders, and sums the two verdicts: a response wins only if it is preferred
  overall (one win and one tie counts as a win; one win each way is a tie).
"""
from __future__ import annotations

import abc

import json
import re
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from hargo.config import Evaluate

__all__ = ["Judge", "BaseJudge", "RewardJudge", "LLMJudge", "make_judge", "sample_question"]


@runtime_checkable
class Judge(Protocol):
    """What ``hargo.metrics.win_rate`` needs from a judge."""

    name: str

    def compare(self, sample: dict, a: str, b: str) -> int:
        """1 if ``a`` is better than ``b`` for ``sample``, -1 if worse, 0 for a tie."""
        ...

    def compare_batch(self, samples: list[dict], a: list[str], b: list[str]) -> list[int]:
        """``compare`` over aligned lists."""
        ...


class BaseJudge(abc.ABC):
    """Judge base class: subclasses implement ``compare``; ``compare_batch`` loops over it."""

    name = "base"

    @abc.abstractmethod
    def compare(self, sample: dict, a: str, b: str) -> int:
        """1 if ``a`` is better than ``b`` for ``sample``, -1 if worse, 0 for a tie."""

    def compare_batch(self, samples: list[dict], a: list[str], b: list[str]) -> list[int]:
        if not len(samples) == len(a) == len(b):
            raise ValueError(f"{self.name}: {len(samples)} samples, {len(a)} and {len(b)} completions")
        return [self.compare(s, x, y) for s, x, y in zip(samples, a, b)]


def _sign(x: float, tol: float) -> int:
    return 0 if abs(x) <= tol else (1 if x > 0 else -1)


class RewardJudge(BaseJudge):
    """Compares the task rewards of the two completions (``hargo.rewards.TaskReward``).

    Args:
        reward_fn: a ``TaskReward`` (default: ``TaskReward()`` with default constants).
        tol: reward differences ``<= tol`` are ties (PLP cosines carry ~1e-7 float noise).
    """

    name = "task-reward"

    def __init__(self, reward_fn=None, tol: float = 1e-6):
        if reward_fn is None:
            from hargo.rewards import TaskReward
            reward_fn = TaskReward()
        self.reward_fn = reward_fn
        self.tol = float(tol)

    def compare(self, sample: dict, a: str, b: str) -> int:
        return self.compare_batch([sample], [a], [b])[0]

    def compare_batch(self, samples: list[dict], a: list[str], b: list[str]) -> list[int]:
        """Scores ``a`` and ``b`` in one reward call (one embedding pass for plp)."""
        n = len(samples)
        if not n == len(a) == len(b):
            raise ValueError(f"{self.name}: {n} samples, {len(a)} and {len(b)} completions")
        both = list(samples) * 2
        r = self.reward_fn(prompts=[s.get("prompt") for s in both],
                           completions=list(a) + list(b), task=[s.get("task") for s in both],
                           answer=[s.get("answer") for s in both],
                           label=[s.get("label") for s in both])
        return [_sign(r[i] - r[n + i], self.tol) for i in range(n)]


def sample_question(sample: dict) -> str:
    """The user prompt of a sample: the last message's content of a conversational ``prompt``,
    or the ``prompt`` string itself."""
    p = sample.get("prompt", "")
    if isinstance(p, list) and p and isinstance(p[-1], dict):
        return str(p[-1].get("content", ""))
    return p if isinstance(p, str) else str(p)


_SYSTEM = ("You are an impartial judge of answers to high-performance-computing questions "
           "(OpenMP data races, MLPerf results, programming-language processing). Judge "
           "correctness against the reference answer first, then clarity and concision.")
_VERDICT = re.compile(r"\b(TIE|A|B)\b")


class LLMJudge(BaseJudge):
    """Judge through an OpenAI-compatible ``/chat/completions`` endpoint.

    Args:
        endpoint: base URL including the API prefix, e.g. ``"http://127.0.0.1:8000/v1"``;
            requests go to ``endpoint + "/chat/completions"``.
        model: the model name the server expects.
        api_key: sent as ``Authorization: Bearer`` when given.
        timeout: seconds per HTTP request.
        max_chars: each response and the question are cut to this many characters in the prompt.
        both_orders: ask with both orders of the two responses (see the module docstring).

    Attributes:
        unparseable: replies that held none of A / B / TIE (each counted as a tie).

    Raises:
        RuntimeError: the endpoint cannot be reached, answers an HTTP error, or returns a body
            without ``choices[0].message.content`` (the message names the URL).
    """

    def __init__(self, endpoint: str, model: str, api_key: str | None = None,
                 timeout: float = 60.0, max_chars: int = 4000, both_orders: bool = True):
        if not endpoint or not model:
            raise ValueError("LLMJudge needs an endpoint and a model name")
        self.url = endpoint.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key
        self.timeout = float(timeout)
        self.max_chars = int(max_chars)
        self.both_orders = bool(both_orders)
        self.name = f"llm:{model}"
        self.unparseable = 0

    def messages(self, sample: dict, first: str, second: str) -> list[dict]:
        """The chat messages asking which of ``first`` (A) and ``second`` (B) is better."""
        ref = sample.get("answer") or sample.get("label") or ""
        cut = self.max_chars
        user = (f"Question:\n{sample_question(sample)[:cut]}\n\nReference answer:\n{str(ref)[:cut]}\n\n"
                f"Response A:\n{first[:cut]}\n\nResponse B:\n{second[:cut]}\n\n"
                "Which response answers the question better? Reply with exactly one word: "
                "A, B or TIE.")
        return [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": user}]

    def _ask(self, messages: list[dict]) -> str:
        body = json.dumps({"model": self.model, "messages": messages, "temperature": 0.0,
                           "max_tokens": 8}).encode("utf-8")
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                data = json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"LLM judge {self.url}: HTTP {e.code} {e.reason}") from e
        except (urllib.error.URLError, OSError) as e:
            raise RuntimeError(f"LLM judge {self.url}: cannot reach the endpoint ({e})") from e
        except json.JSONDecodeError as e:
            raise RuntimeError(f"LLM judge {self.url}: response is not JSON ({e})") from e
        try:
            return str(data["choices"][0]["message"]["content"] or "")
        except (KeyError, IndexError, TypeError) as e:
            raise RuntimeError(f"LLM judge {self.url}: no choices[0].message.content in {data!r:.200}") from e

    def _verdict(self, reply: str) -> int:
        """+1 for A, -1 for B, 0 for TIE; the first verdict word of the reply counts."""
        m = _VERDICT.search(reply.upper())
        if m is None:
            self.unparseable += 1
            return 0
        return {"A": 1, "B": -1, "TIE": 0}[m.group(1)]

    def compare(self, sample: dict, a: str, b: str) -> int:
        v = self._verdict(self._ask(self.messages(sample, a, b)))
        if self.both_orders:
            v -= self._verdict(self._ask(self.messages(sample, b, a)))
        return _sign(v, 0)


def make_judge(evaluate: "Evaluate", reward_fn=None) -> Judge:
    """The judge named by params.yaml ``evaluate``: ``judge: reward`` -> ``RewardJudge(reward_fn)``;
    ``judge: llm`` -> ``LLMJudge(judge_endpoint, judge_model)``.

    Args:
        evaluate: the typed ``evaluate`` section (:class:`hargo.config.Evaluate`; a caller with
            the params mapping converts it once: ``hargo.config.as_config(params).evaluate``).
        reward_fn: the task reward the ``reward`` judge compares with.

    Raises:
        ValueError: another judge, or the llm judge without its endpoint/model (the config
            refuses both when it is built; a section made by ``dataclasses.replace`` is checked
            here)."""
    kind, ep, model = evaluate.judge, evaluate.judge_endpoint, evaluate.judge_model
    if kind == "reward":
        return RewardJudge(reward_fn)
    if kind == "llm":
        if not ep or not model:
            raise ValueError("evaluate.judge is 'llm' but evaluate.judge_endpoint / judge_model "
                             "are not set in params.yaml")
        return LLMJudge(ep, model)
    raise ValueError(f"evaluate.judge must be 'reward' or 'llm', got {kind!r}")
