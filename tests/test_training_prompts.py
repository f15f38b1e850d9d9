"""Our training prompts never contain a bench prompt, nor a near copy of one (DEVELOPERS.md:
measure on the bench prompts, never train on them)."""

import json

import pytest

from specdemo.bench import DEFAULT_PROMPTS
from training.prompts import first_stage_prompts, passage_prompts, passage_requests
from training.prompts_varied import varied_first_stage, varied_passage_prompts, varied_passage_requests
from training.real_prompts import SHARED_BENCH, bench_prompts
from training.real_prompts import word_runs as real_word_runs

NEAR_COPY_WORDS = 8  # generic phrases ("write a short poem about") are shared; 8 words in a row are not


def word_runs(text: str, length: int) -> set[tuple[str, ...]]:
    words = text.lower().split()
    return {tuple(words[i : i + length]) for i in range(len(words) - length + 1)}


def training_prompts(seed: int) -> list[str]:
    """Both families, with a stand-in for the passages the target writes at data time."""
    requests = passage_requests()
    topics = [request.split("about ")[-1].rstrip(".") for request in requests]
    varied_requests = varied_passage_requests()
    return (
        first_stage_prompts(seed) + requests + passage_prompts({topic: "PASSAGE" for topic in topics}, seed)
        + varied_first_stage(seed) + varied_requests + varied_passage_prompts(["PASSAGE"] * len(varied_requests), seed)
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_training_prompts_hold_no_bench_prompt(seed):
    bench = [json.loads(line)["turns"][0] for line in DEFAULT_PROMPTS.read_text().splitlines() if line.strip()]
    bench_runs = set().union(*(word_runs(prompt, NEAR_COPY_WORDS) for prompt in bench))
    prompts = training_prompts(seed)
    assert len(prompts) > 2000
    assert not set(prompts) & set(bench)
    near_copies = [prompt for prompt in prompts if word_runs(prompt, NEAR_COPY_WORDS) & bench_runs]
    assert not near_copies, near_copies[:3]


@pytest.mark.skipif(not SHARED_BENCH.exists(), reason="no ../shared/bench beside the project")
@pytest.mark.parametrize("seed", [0, 1])
def test_training_prompts_nearly_copy_no_spec_bench_question(seed):
    """`distill --templates` mixes these into the real-prompt data: Spec-Bench's rule holds for them too."""
    bench = bench_prompts()
    bench_runs = set().union(*(real_word_runs(text) for text in bench))
    prompts = training_prompts(seed)
    assert not {p.strip() for p in prompts} & {text.strip() for text in bench}
    assert not [p for p in prompts if real_word_runs(p) & bench_runs]
