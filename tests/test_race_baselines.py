"""Race metrics a prior cannot fool: the first-token yes/no score (for ROC AUC) on a tiny model
against a plain torch forward, the nearest-train baseline on crafted kernels with hand-computed
Jaccard similarities, and the always-yes row on a crafted eval set."""
from __future__ import annotations

import math

import pytest

from hargo.testing import crafted_record


def _race(i: int, task: str, text: str, label: str, prefix: str = "t") -> dict:
    return crafted_record(i, task, text, label, label, id_prefix=prefix)


# --------------------------------------------------------------------------------------------
# nearest-train

# file order matters: ties go to the first; the mlperf record is not a race kernel
TRAIN = [_race(0, "race_c", "x = y + z", "yes"),            # pool 0: {x, =, y, +, z}
         _race(1, "race_c", "x = y", "no"),                 # pool 1: {x, =, y}
         crafted_record(2, "mlperf", "x = y", "8", id_prefix="t"),
         _race(3, "race_fortran", "p = q", "yes"),          # pool 2: {p, =, q}
         _race(4, "race_c", "p = q", "no")]                 # pool 3: {p, =, q}
QUERIES = [_race(0, "race_c", "x = y + w", "yes", "e"),     # {x, =, y, +, w}
           _race(1, "race_fortran", "x = y", "no", "e"),
           _race(2, "race_c", "p = q", "no", "e"),
           _race(3, "race_c", "P = Q", "no", "e")]          # case kept: {P, =, Q}


def test_prompt_tokens_and_jaccard_by_hand():
    from hargo.evaluation.baselines import jaccard, kernel_tokens

    p = [{"role": "system", "content": "ignored words"},
         {"role": "user", "content": "a[i] = a[i+1];  // x_1"}]
    assert kernel_tokens(p) == {"a", "[", "i", "]", "=", "+", "1", ";", "/", "x_1"}
    assert jaccard(frozenset("abc"), frozenset("bcd")) == 0.5  # {b, c} / {a, b, c, d}
    assert jaccard(frozenset(), frozenset()) == 0.0
    with pytest.raises(ValueError, match="no user message"):
        kernel_tokens([{"role": "system", "content": "x"}])


def test_nearest_train_predictions_by_hand():
    """q0 {x,=,y,+,w}: vs pool 0 4/6 = 2/3 (yes), pool 1 3/5 (no), pools 2-3 1/7: yes, score
    2/3 - 3/5 = 1/15. q1 {x,=,y}: pool 1 is identical (no, 1.0), pool 0 3/5: no, score -2/5.
    q2 {p,=,q}: pools 2 (yes) and 3 (no) both 1.0: the first in file order, yes; score 0.
    q3 {P,=,Q}: pool 0 1/7, pools 1, 2, 3 each 1/5: nearest yes 1/5 (pool 2) ties nearest no
    1/5 (pool 1, earlier in the file): no; score 0."""
    from hargo.evaluation.baselines import nearest_train

    out = nearest_train(TRAIN, QUERIES)
    assert [o["prediction"] for o in out] == ["yes", "no", "yes", "no"]
    assert [o["neighbour"] for o in out] == ["trace_c-00000", "trace_c-00001",
                                             "trace_fortran-00003", "trace_c-00001"]
    assert [o["similarity"] for o in out] == pytest.approx([2 / 3, 1.0, 1.0, 1 / 5])
    assert [o["score"] for o in out] == pytest.approx([1 / 15, -2 / 5, 0.0, 0.0])
    with pytest.raises(ValueError, match="no race record"):
        nearest_train(TRAIN[2:3], QUERIES)
    with pytest.raises(ValueError, match="single label"):
        nearest_train([TRAIN[0], TRAIN[3]], QUERIES)


def test_baseline_entries_always_yes_and_nearest_train_by_hand():
    """Labels yes, no, no, no (and a plp prompt, ignored).

    always-yes: tp 1, fp 3: precision 1/4, recall 1, F1 = 2/(2 + 3) = 2/5, accuracy 1/4,
    MCC 0, balanced accuracy 1/2, yes share 1, constant score: AUC 1/2.
    nearest-train: predictions yes, no, yes, no: tp 1, fp 1, fn 0, tn 2: F1 = 2/(2 + 1) = 2/3,
    accuracy 3/4, MCC = (1*2 - 1*0) / sqrt(2*1*3*2) = 1/sqrt(3), balanced (1 + 2/3)/2 = 5/6,
    yes share 1/2; scores 1/15, -2/5, 0, 0: the yes prompt ranks above every no prompt, AUC 1.
    """
    from hargo.evaluation.evaluate import ALWAYS_YES, NEAREST_TRAIN, baseline_entries

    subset = QUERIES[:2] + [crafted_record(9, "plp", "What is MPI?", "A standard.")] + QUERIES[2:]
    entries, rows = baseline_entries(subset, TRAIN)
    conf = {k: e.pop("dr_confusion") for k, e in entries.items()}
    assert conf == {ALWAYS_YES: {"tp": 1, "fp": 3, "fn": 0, "tn": 0},
                    NEAREST_TRAIN: {"tp": 1, "fp": 1, "fn": 0, "tn": 2}}
    assert entries[ALWAYS_YES] == pytest.approx({
        "baseline": True, "n_race": 4, "dr_f1": 2 / 5, "dr_precision": 1 / 4, "dr_recall": 1.0,
        "dr_accuracy": 1 / 4, "dr_mcc": 0.0, "dr_balanced_accuracy": 0.5, "dr_yes_share": 1.0,
        "dr_auc": 0.5})
    assert entries[NEAREST_TRAIN] == pytest.approx({
        "baseline": True, "n_race": 4, "dr_f1": 2 / 3, "dr_precision": 1 / 2, "dr_recall": 1.0,
        "dr_accuracy": 3 / 4, "dr_mcc": 1 / math.sqrt(3), "dr_balanced_accuracy": 5 / 6,
        "dr_yes_share": 1 / 2, "dr_auc": 1.0})
    assert [(r["id"], r["label"], r["prediction"]) for r in rows] == [
        ("erace_c-00000", "yes", "yes"), ("erace_fortran-00001", "no", "no"),
        ("erace_c-00002", "no", "yes"), ("erace_c-00003", "no", "no")]
    # without race prompts: no metrics, the train split not needed
    e, r = baseline_entries([subset[2]], [])
    assert r == [] and e[ALWAYS_YES]["dr_f1"] is None and e[NEAREST_TRAIN]["dr_auc"] is None


# --------------------------------------------------------------------------------------------
# the first-token yes/no score


def test_answer_token_ids_are_the_single_token_yes_and_no_words(tiny_tokenizer_dir):
    from transformers import AutoTokenizer

    from hargo.evaluation.scoring import answer_token_ids

    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer_dir))
    v = answer_token_ids(tok)
    assert sorted(tok.decode([i]) for i in v["yes"]) == [" Yes", " yes", "Yes", "yes"]
    assert sorted(tok.decode([i]) for i in v["no"]) == [" NO", " No", " no", "NO", "No", "no"]
    assert v["yes"] == sorted(tok.convert_tokens_to_ids(["yes", "Yes", "Ġyes", "ĠYes"]))


def test_yes_no_score_equals_a_plain_torch_forward(tiny_model_dir):
    """Batched and left-padded (batch size 2, prompts of different lengths) against one
    unpadded forward per prompt: softmax at the next position, probabilities summed over the
    hand-listed variant ids, log ratio."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from hargo.evaluation.scoring import score_yes_no

    prompts = [[{"role": "user", "content": "Is there a data race? " + "a[i] = a[i+1]; " * k}]
               for k in (1, 9, 3)]
    rows, secs = score_yes_no(tiny_model_dir, prompts, {"dtype": "float32", "batch_size": 2})
    assert secs > 0 and len(rows) == 3

    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    yes = tok.convert_tokens_to_ids(["yes", "Yes", "Ġyes", "ĠYes"])
    no = tok.convert_tokens_to_ids(["no", "No", "NO", "Ġno", "ĠNo", "ĠNO"])
    for p, row in zip(prompts, rows):
        text = tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            probs = torch.softmax(model(ids).logits[0, -1].double(), dim=-1)
        ly, ln = math.log(probs[yes].sum().item()), math.log(probs[no].sum().item())
        assert row["log_p_yes"] == pytest.approx(ly, abs=1e-4)
        assert row["log_p_no"] == pytest.approx(ln, abs=1e-4)
        assert row["yes_no_score"] == pytest.approx(ly - ln, abs=1e-4)
    assert score_yes_no(tiny_model_dir, [], {}) == ([], 0.0)
