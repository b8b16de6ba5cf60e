"""Metrics on crafted samples (confusion matrix counted by hand), WinRate with ties through the
reward judge, and the LLM judge against a tiny local OpenAI-compatible server."""
from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hargo.judges import LLMJudge, RewardJudge, make_judge
from hargo.metrics import compute_metrics, race_classification, score_samples, win_rate
from hargo.rewards import RewardConfig, TaskReward, get_scorer

PLP_REF = "CodeBERT is a bimodal pre-trained model for programming and natural languages."


@pytest.fixture(scope="module")
def reward_fn():
    """A TaskReward on the process-wide MiniLM scorer (model loaded once per process)."""
    return TaskReward(RewardConfig(), get_scorer())


def _race(i, task, label):
    return {"id": f"{task}-{i}", "task": task, "label": label, "answer": label,
            "prompt": [{"role": "user", "content": "Is there a data race?"}]}


def _qa(i, task, answer):
    return {"id": f"{task}-{i}", "task": task, "answer": answer, "label": None,
            "prompt": [{"role": "user", "content": "Question?"}]}


# (sample, completion) pairs with their hand-assigned outcome
CRAFTED = [
    (_race(1, "race_c", "yes"), "Yes"),                       # TP
    (_race(2, "race_c", "yes"), "yes, there is"),             # TP
    (_race(3, "race_c", "yes"), "No data race"),              # FN
    (_race(4, "race_c", "yes"), "maybe"),                     # unparseable -> "no": FN
    (_race(5, "race_c", "no"), "no"),                         # TN
    (_race(7, "race_fortran", "no"), "yes and no"),           # unparseable -> "yes": FP
    (_race(8, "race_fortran", "no"), "No."),                  # TN
    (_race(9, "race_fortran", "yes"), "YES"),                 # TP
    (_race(10, "race_fortran", "yes"), [{"role": "assistant", "content": "yes"}]),  # TP
    (_qa(1, "mlperf", "3.0-2087"), "The ID is 3.0-2087."),    # EM, reward 1
    (_qa(2, "mlperf", "1,024"), "1024 accelerators"),         # numeric, reward 1, not EM
    (_qa(3, "mlperf", "Habana Gaudi2, 8"), "Habana Gaudi2"),  # partial 0.5
    (_qa(4, "mlperf", "Dell"), "Dellx"),                      # 0
    (_qa(1, "plp", PLP_REF), PLP_REF),                        # cosine 1, reward 1.1
    (_qa(2, "plp", PLP_REF), ""),                             # cosine 0, reward 0
]
SAMPLES = [s for s, _ in CRAFTED]
COMPLETIONS = [c for _, c in CRAFTED]


def test_compute_metrics_crafted(reward_fn):
    m = compute_metrics(SAMPLES, COMPLETIONS, reward_fn=reward_fn)
    # pooled: TP 4, FP 1, FN 2, TN 2
    tp, fp, fn, tn = 4, 1, 2, 2
    assert m["dr_confusion"] == {"tp": tp, "fp": fp, "fn": fn, "tn": tn, "labels": ["yes", "no"],
                                 "matrix": [[tp, fn], [fp, tn]]}
    p, r = tp / (tp + fp), tp / (tp + fn)
    assert m["dr_precision"] == pytest.approx(0.8)
    assert m["dr_recall"] == pytest.approx(2 / 3)
    assert m["dr_f1"] == pytest.approx(2 * p * r / (p + r)) == pytest.approx(8 / 11)
    assert m["dr_unparseable"] == 2
    assert m["dr_f1_race_c"] == pytest.approx(2 / 3)        # TP 2, FN 2: P 1, R 1/2
    assert m["dr_f1_race_fortran"] == pytest.approx(0.8)    # TP 2, FP 1: P 2/3, R 1
    assert m["mlperf_em"] == pytest.approx(1 / 4)
    assert m["accuracy_mlperf"] == pytest.approx(2 / 4)
    assert m["plp_similarity"] == pytest.approx(0.5, abs=1e-5)
    assert m["accuracy_plp"] == pytest.approx(0.5)
    assert m["accuracy_race_c"] == pytest.approx(3 / 5)
    assert m["accuracy_race_fortran"] == pytest.approx(3 / 4)
    # rewards: race 6 x 1, mlperf 1 + 1 + 0.5 + 0, plp 1.1 + 0
    assert m["avg_score"] == pytest.approx((6 + 2.5 + 1.1) / 15, abs=1e-6)
    assert m["n"] == 15 and m["n_race_c"] == 5 and m["n_race_fortran"] == 4
    assert m["n_mlperf"] == 4 and m["n_plp"] == 2
    assert m["mean_completion_chars_race_c"] == pytest.approx((3 + 13 + 12 + 5 + 2) / 5)
    assert m["median_completion_chars_race_c"] == 5.0
    assert m["mean_completion_chars_plp"] == pytest.approx(len(PLP_REF) / 2)
    json.dumps(m)  # serialisable as is


def test_score_samples_records(reward_fn):
    recs = score_samples(SAMPLES, COMPLETIONS, reward_fn)
    assert [r["id"] for r in recs] == [s["id"] for s in SAMPLES]
    assert recs[3] == {"id": "race_c-4", "task": "race_c", "completion": "maybe", "reward": 0.0,
                       "correct": False, "chars": 5, "prediction": None, "label": "yes",
                       "degenerate": None}
    assert recs[8]["completion"] == "yes" and recs[8]["correct"] is True
    assert recs[10]["em"] is False and recs[10]["correct"] is True and recs[10]["reward"] == 1.0
    assert recs[13]["similarity"] == pytest.approx(1.0, abs=1e-5)


@pytest.mark.fast
def test_precomputed_rewards_and_absent_tasks():
    race = [(s, c) for s, c in CRAFTED if s["task"].startswith("race")]
    samples, completions = [s for s, _ in race], [c for _, c in race]
    rewards = [0.5] * len(samples)
    m = compute_metrics(samples, completions, rewards=rewards,
                        reward_fn=TaskReward(RewardConfig(), scorer=None))
    assert m["avg_score"] == 0.5
    assert m["plp_similarity"] is None and m["mlperf_em"] is None
    assert "n_plp" not in m and m["dr_f1"] == pytest.approx(8 / 11)


@pytest.mark.fast
def test_race_classification_against_hand_counts():
    labels = ["yes", "yes", "no", "no", "no", "yes"]
    preds = ["yes", None, "yes", "no", None, "no"]
    # yes/yes TP; yes/None -> no FN; no/yes FP; no/no TN; no/None -> yes FP; yes/no FN
    out = race_classification(labels, preds)
    assert out["confusion"]["matrix"] == [[1, 2], [2, 1]]
    assert out["precision"] == pytest.approx(1 / 3) and out["recall"] == pytest.approx(1 / 3)
    assert out["f1"] == pytest.approx(1 / 3)
    none = race_classification(["no", "no"], ["no", "no"])  # no positives at all
    assert none["f1"] == 0.0 and none["confusion"]["tn"] == 2
    assert race_classification([], [])["f1"] is None


@pytest.mark.fast
def test_metrics_that_a_prior_cannot_fool_and_the_always_yes_row():
    """tp=1, fn=1, fp=1, tn=2 by hand: MCC = (1*2 - 1*1) / sqrt(2*2*3*3) = 1/6, balanced
    accuracy = (1/2 + 2/3) / 2 = 7/12, accuracy 3/5, "yes" share 2/5. Always-yes on the same
    labels (2 of 5 "yes"): F1 = 2*(2/5) / (1 + 2/5) = 4/7, accuracy 2/5, MCC 0, balanced 1/2."""
    labels = ["yes", "yes", "no", "no", "no"]
    preds = ["yes", "no", "yes", "no", "no"]
    out = race_classification(labels, preds)
    assert out["mcc"] == pytest.approx(1 / 6)
    assert out["balanced_accuracy"] == pytest.approx(7 / 12)
    assert out["accuracy"] == pytest.approx(3 / 5) and out["yes_share"] == pytest.approx(2 / 5)
    assert out["always_yes"] == pytest.approx({"f1": 4 / 7, "accuracy": 2 / 5, "mcc": 0.0,
                                               "balanced_accuracy": 0.5})
    # a model that answers "yes" to everything IS the always-yes row: F1 looks fine, MCC is 0
    trivial = race_classification(labels, ["yes"] * 5)
    assert trivial["f1"] == pytest.approx(4 / 7) and trivial["mcc"] == 0.0
    assert trivial["balanced_accuracy"] == 0.5 and trivial["yes_share"] == 1.0
    # an inverted classifier: MCC -1
    assert race_classification(labels, ["no", "no", "yes", "yes", "yes"])["mcc"] == \
        pytest.approx(-1.0)


@pytest.mark.fast
def test_race_auc_by_hand_and_undefined_with_one_class():
    """3 "yes" scores (0.9, 0.4, 0.2) against 2 "no" scores (0.1, 0.4): of the 6 yes/no pairs
    the yes score is higher in 4 (0.9>0.1, 0.9>0.4, 0.4>0.1, 0.2>0.1), tied in 1 (0.4 = 0.4,
    counts half), lower in 1 (0.2 < 0.4): AUC = 4.5 / 6 = 0.75."""
    from hargo.metrics import race_auc

    labels = ["yes", "no", "Yes", "no", "yes"]
    assert race_auc(labels, [0.9, 0.1, 0.4, 0.4, 0.2]) == pytest.approx(0.75)
    # perfect and inverted rankings; a constant score ranks nothing (the always-yes row)
    assert race_auc(labels, [3.0, -1.0, 2.0, -2.0, 1.0]) == 1.0
    assert race_auc(labels, [-3.0, 1.0, -2.0, 2.0, -1.0]) == 0.0
    assert race_auc(labels, [0.0] * 5) == 0.5
    # undefined, not chance: one class only, or nothing
    assert race_auc(["yes", "yes"], [0.1, 0.2]) is None and race_auc([], []) is None
    with pytest.raises(ValueError, match="2 labels but 1 scores"):
        race_auc(["yes", "no"], [0.1])
    with pytest.raises(ValueError, match="score #1 is nan"):
        race_auc(["yes", "no"], [0.1, float("nan")])
    with pytest.raises(ValueError, match="score #0 is None"):
        race_auc(["yes", "no"], [None, 0.3])


@pytest.mark.fast
def test_bad_samples_are_named():
    with pytest.raises(ValueError, match=r"unknown task 'sql' \(sample id 'x-1'\)"):
        compute_metrics([{"id": "x-1", "task": "sql", "answer": "a"}], ["a"])
    with pytest.raises(ValueError, match=r"sample id 'race_c-9', field 'label'"):
        compute_metrics([{"id": "race_c-9", "task": "race_c", "label": None}], ["yes"])
    with pytest.raises(ValueError, match=r"sample id 'mlperf-9', field 'answer'"):
        compute_metrics([{"id": "mlperf-9", "task": "mlperf"}], ["8"])
    with pytest.raises(ValueError, match="2 samples but 1 completions"):
        compute_metrics(SAMPLES[:2], COMPLETIONS[:1])


# ---------------------------------------------------------------------------------- WinRate

def test_win_rate_reward_judge(reward_fn):
    pairs = [
        (_race(1, "race_c", "yes"), "yes", "no", 1),
        (_race(2, "race_c", "no"), "yes", "no", -1),
        (_race(3, "race_c", "yes"), "yes", "Yes!", 0),
        (_race(4, "race_fortran", "no"), "no", "maybe", 1),
        (_qa(1, "mlperf", "Habana Gaudi2, 8"), "Habana Gaudi2", "8, Habana Gaudi2", -1),
        (_qa(2, "mlperf", "Dell"), "Dell", "dell.", 0),
        (_qa(3, "plp", PLP_REF), PLP_REF, "", 1),
    ]
    judge = RewardJudge(reward_fn)
    samples = [p[0] for p in pairs]
    a, b = [p[1] for p in pairs], [p[2] for p in pairs]
    assert judge.compare_batch(samples, a, b) == [p[3] for p in pairs]
    assert judge.compare(samples[0], "yes", "no") == 1
    out = win_rate(samples, a, b, judge)
    assert out == {"win_rate": pytest.approx((3 + 0.5 * 2) / 7), "wins": 3, "ties": 2,
                   "losses": 2, "n": 7, "judge": "task-reward",
                   "verdicts": [p[3] for p in pairs]}
    assert win_rate(samples, b, a, judge)["win_rate"] == pytest.approx((2 + 1) / 7)
    assert win_rate([], [], [], judge)["win_rate"] is None


class _ScriptedJudge:
    name = "scripted"

    def __init__(self, verdicts):
        self.verdicts = list(verdicts)

    def compare(self, sample, a, b):
        return self.verdicts.pop(0)


@pytest.mark.fast
def test_win_rate_judge_without_batch_and_bad_verdict():
    s = SAMPLES[:4]
    out = win_rate(s, ["a"] * 4, ["b"] * 4, _ScriptedJudge([1, 0, 0, 0]))
    assert out["win_rate"] == pytest.approx((1 + 1.5) / 4) and out["judge"] == "scripted"
    with pytest.raises(ValueError, match="verdicts must be 1, 0 or -1"):
        win_rate(s, ["a"] * 4, ["b"] * 4, _ScriptedJudge([1, 2, 0, 0]))
    with pytest.raises(ValueError, match="baseline completions"):
        win_rate(s, ["a"] * 4, ["b"] * 3, _ScriptedJudge([]))


# -------------------------------------------------------------------------------- LLM judge

class _FakeOpenAI(BaseHTTPRequestHandler):
    """Minimal /v1/chat/completions. Modes: 'content' prefers the response containing GOOD,
    'always_a' is position-biased, 'garbage' answers no verdict, 'error' answers HTTP 500."""

    def do_POST(self):  # noqa: N802 - http.server API
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        srv.requests.append({"path": self.path, "body": body,
                             "auth": self.headers.get("Authorization")})
        if srv.mode == "error":
            self.send_error(500, "boom")
            return
        user = body["messages"][-1]["content"]
        first = user.split("Response A:\n", 1)[1].split("\n\nResponse B:\n", 1)[0]
        second = user.split("\n\nResponse B:\n", 1)[1].split("\n\nWhich response", 1)[0]
        if srv.mode == "always_a":
            verdict = "A"
        elif srv.mode == "garbage":
            verdict = "I cannot decide."
        elif "GOOD" in first and "GOOD" not in second:
            verdict = "A"
        elif "GOOD" in second and "GOOD" not in first:
            verdict = "B."
        else:
            verdict = "tie"
        data = json.dumps({"choices": [{"message": {"role": "assistant", "content": verdict}}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data.encode())

    def log_message(self, *args):
        pass


@pytest.fixture()
def fake_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeOpenAI)
    server.requests, server.mode = [], "content"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_llm_judge_against_local_server(fake_server):
    host, port = fake_server.server_address
    judge = LLMJudge(f"http://{host}:{port}/v1/", "judge-model", api_key="k", timeout=5)
    assert judge.name == "llm:judge-model"
    s = SAMPLES[:3]
    out = win_rate(s, ["GOOD answer", "meh", "GOOD"], ["bad", "GOOD answer", "GOOD too"], judge)
    assert (out["wins"], out["ties"], out["losses"], out["n"]) == (1, 1, 1, 3)
    assert out["win_rate"] == pytest.approx(0.5) and out["judge"] == "llm:judge-model"
    req = fake_server.requests
    assert len(req) == 6  # both orders per pair
    assert {r["path"] for r in req} == {"/v1/chat/completions"}
    assert req[0]["body"]["model"] == "judge-model" and req[0]["body"]["temperature"] == 0.0
    assert req[0]["auth"] == "Bearer k"
    assert "Reference answer:\nyes" in req[0]["body"]["messages"][-1]["content"]
    # the second request of a pair swaps the positions
    assert "Response A:\nbad" in req[1]["body"]["messages"][-1]["content"]

    fake_server.mode = "always_a"  # position bias cancels out: ties
    assert judge.compare_batch(s, ["x"] * 3, ["y"] * 3) == [0, 0, 0]
    fake_server.mode = "garbage"
    assert judge.compare(s[0], "x", "y") == 0 and judge.unparseable == 2
    fake_server.mode = "error"
    with pytest.raises(RuntimeError, match=r"chat/completions: HTTP 500"):
        judge.compare(s[0], "x", "y")


def test_llm_judge_unreachable():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    judge = LLMJudge(f"http://127.0.0.1:{port}/v1", "m", timeout=2)
    with pytest.raises(RuntimeError, match="cannot reach"):
        judge.compare(SAMPLES[0], "a", "b")


def test_make_judge(committed_params):
    """A section built past the config's own checks (``dataclasses.replace``) is refused by the
    judge too: an llm judge without its endpoint or model, or a judge of another kind."""
    import dataclasses

    from hargo.config import Config

    ev = Config.from_params(committed_params).evaluate
    assert make_judge(dataclasses.replace(ev, judge="reward")).name == "task-reward"
    j = make_judge(dataclasses.replace(ev, judge="llm", judge_endpoint="http://127.0.0.1:1/v1",
                                       judge_model="q"))
    assert isinstance(j, LLMJudge) and j.name == "llm:q"
    with pytest.raises(ValueError, match="judge_endpoint"):
        make_judge(dataclasses.replace(ev, judge="llm", judge_endpoint=None, judge_model=None))
    with pytest.raises(ValueError, match="judge_endpoint"):
        make_judge(dataclasses.replace(ev, judge="llm", judge_endpoint="http://127.0.0.1:1/v1",
                                       judge_model=None))
    with pytest.raises(ValueError, match="'reward' or 'llm'"):
        make_judge(dataclasses.replace(ev, judge="human"))


def test_make_judge_from_the_typed_evaluate_section(committed_params):
    from hargo.config import Config
    from hargo.params import apply_overrides

    cfg = Config.from_params(apply_overrides(committed_params, {
        "evaluate.judge": "llm", "evaluate.judge_endpoint": "http://127.0.0.1:1/v1",
        "evaluate.judge_model": "q"}))
    assert make_judge(cfg.evaluate).name == "llm:q"
    assert make_judge(Config.from_params(committed_params).evaluate).name == "task-reward"


# ---------------------------------------------------------------------------------- hedging

def _mlperf(i, answer, question):
    return {"id": f"mlperf-{i}", "task": "mlperf", "answer": answer, "label": None,
            "prompt": [{"role": "user", "content": question}]}


HEDGE_CASES = [  # (sample, completion, reward, em): the metrics follow the reward's hedging rule
    (_mlperf(1, "8", "How many accelerators?"), "8 GPUs", 1.0, True),
    (_mlperf(2, "8", "How many accelerators?"), "0 1 2 4 8 16 32 64 128", 1 / 9, False),
    (_mlperf(3, "Dell", "Who is the submitter?"),
     "Dell, NVIDIA, HPE, Lenovo, Supermicro, GIGABYTE", 1 / 6, False),
    (_mlperf(4, "Dell", "Who is the submitter?"), "The submitter is Dell or HPE.", 1 / 2, False),
    # the prompt's own values are a restatement, not candidates (8480 would halve it otherwise)
    (_mlperf(5, "4", "How many accelerators has the Platinum 8480+ system?"),
     "The Platinum 8480+ system has 4 accelerators.", 1.0, True),
]


def test_metrics_follow_the_hedging_rule(reward_fn):
    samples = [c[0] for c in HEDGE_CASES]
    comps = [c[1] for c in HEDGE_CASES]
    scored = score_samples(samples, comps, reward_fn)
    assert [r["reward"] for r in scored] == pytest.approx([c[2] for c in HEDGE_CASES])
    assert [r["em"] for r in scored] == [c[3] for c in HEDGE_CASES]
    assert [r["correct"] for r in scored] == [c[2] == 1.0 for c in HEDGE_CASES]
    m = compute_metrics(samples, comps, reward_fn=reward_fn)
    assert m["mlperf_em"] == pytest.approx(2 / 5) and m["accuracy_mlperf"] == pytest.approx(2 / 5)
    assert m["avg_score"] == pytest.approx((1 + 1 / 9 + 1 / 6 + 1 / 2 + 1) / 5)
    # the reward judge sees the prompts too: the precise answer beats every hedge, ties itself
    judge = RewardJudge(reward_fn)
    precise = ["8", "8", "Dell", "Dell", "4"]
    assert judge.compare_batch(samples, precise, comps) == [0, 1, 1, 1, 0]


@pytest.mark.fast
def test_mlperf_em_and_accuracy_need_a_whole_number_token():
    """EM and accuracy follow the reward's token-boundary rule: a number reference inside a
    longer number or id ("2" in "2.00GHz", "0" in "3.0-2018") is no match; "2 GPUs" is."""
    q = "How many processors?"
    samples = [{**_qa(i, "mlperf", a), "prompt": q} for i, a in enumerate(["2", "0", "2", "3.0"])]
    completions = ["Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz", "The ID is 3.0-2018.", "2 GPUs",
                   "MLPerf Training v3.0"]
    scored = score_samples(samples, completions, TaskReward(RewardConfig(), scorer=None))
    assert [r["em"] for r in scored] == [False, False, True, False]
    assert [r["correct"] for r in scored] == [False, False, True, False]
    assert [r["reward"] for r in scored] == [0.0, 0.0, 1.0, 0.0]
    m = compute_metrics(samples, completions, reward_fn=TaskReward(RewardConfig(), scorer=None))
    assert m["mlperf_em"] == m["accuracy_mlperf"] == pytest.approx(1 / 4)


def test_headline_keeps_the_headline_metrics_in_order_and_takes_means():
    from hargo.metrics import headline, headline_metrics

    assert headline_metrics() == ("dr_f1", "dr_mcc", "plp_similarity", "mlperf_em", "avg_score",
                                "win_rate")
    got = headline({"sft": {"win_rate": None, "avg_score": 0.5, "dr_f1": 0.25, "n": 96,
                            "dr_confusion": {"tp": 1}},
                    "hargo": {"dr_f1": {"mean": 0.4, "std": 0.1, "values": [0.3, 0.5]},
                              "win_rate": {"mean": 0.6}, "dr_mcc": True},
                    "seeds": [1, 2, 3]})
    assert got == {"sft": {"dr_f1": 0.25, "avg_score": 0.5},
                   "hargo": {"dr_f1": 0.4, "win_rate": 0.6}}
    assert list(got["sft"]) == ["dr_f1", "avg_score"]
