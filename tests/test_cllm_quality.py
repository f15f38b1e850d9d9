"""The CLLM's quality check (training/cllm_quality.py) and how the app words it."""

import json

import torch
from test_distill import tiny_target

from specdemo.app.views import cllm_quality_html
from specdemo.methods import cllm
from training.cllm_quality import MAX_BIGRAM_DROP, base_nll, measure

from conftest import make_tiny_model


def test_a_copy_of_the_base_passes_and_a_worse_model_does_not():
    target = tiny_target()
    target.dtype = torch.float32
    prompts = ["abc", "hello there", "a longer prompt", "zz top"]
    same = measure(target, target, prompts, 12)
    assert same["answers_differ"] == 0 and same["bigram_drop"] == 0 and abs(same["nll_ratio"] - 1) < 1e-6 \
        and same["passes"]
    looping = tiny_target()
    looping.model = make_tiny_model(seed=1)
    with torch.no_grad():  # a model stuck on one token: every answer a loop
        looping.model.lm_head.weight.zero_()
        looping.model.lm_head.bias = None
        looping.model.model.norm.weight.fill_(1.0)
        looping.model.lm_head.weight[11] = 100 * looping.model.model.norm.weight.sign()
    worse = measure(target, looping, prompts, 12)
    assert worse["answers_differ"] == len(prompts) and worse["distinct_bigrams"]["cllm"] < 0.2
    assert worse["bigram_drop"] > MAX_BIGRAM_DROP and not worse["passes"]


def test_base_nll_is_the_mean_cross_entropy_of_the_answer_tokens():
    target = tiny_target()
    ids, answer = [5, 6, 7], [8, 9]
    logits = target.model(torch.tensor([ids + answer])).logits[0]
    expected = -(torch.log_softmax(logits[2], -1)[8] + torch.log_softmax(logits[3], -1)[9]) / 2
    assert abs(base_nll(target, [ids], [answer]) - expected.item()) < 1e-5


def test_the_app_reads_and_words_the_check(tmp_path):
    assert cllm.quality(tmp_path) is None and cllm_quality_html(None) == ""
    report = {"prompts": 50, "distinct_bigrams": {"base": 0.63, "cllm": 0.45}, "nll_ratio": 1.4, "passes": False,
              "bounds": {"max_bigram_drop": 0.05, "max_nll_ratio": 1.25}}
    (tmp_path / cllm.QUALITY_FILE).write_text(json.dumps(report))
    text = cllm_quality_html(cllm.quality(tmp_path))
    assert "0.45" in text and "0.63" in text and "1.40x" in text and "<b>outside</b>" in text
