"""The prompts the page and the docs show are new to the model: a gain shown on them is
prediction, not recall of an answer stored in our own datastore, and no training plan holds a
near-copy of them (`training.real_prompts.HeldOut`, applied when a plan is made)."""

import pytest

from specdemo.app.lesson import LESSON, shown_prompts
from specdemo.assets import EMBEDDED_ANSWERS
from specdemo.core.events import final_summary
from specdemo.methods import ar
from specdemo.methods.retrieval import load_datastore
from training.prompts import first_stage_prompts, without_bench_prompts
from training.real_prompts import SHARED_TRAIN, Prompt, SamplingPlan, bench_prompts, plan, read_prompts

MOST_SHARED = 0.10  # of an answer's 16-token runs, at most this share may occur in a datastore


def test_the_page_shows_the_lessons_prompts_and_the_docs_ones():
    shown = shown_prompts()
    assert {step.prompt for step in LESSON} <= set(shown) and "Why is the sky blue?" in shown


@pytest.fixture(scope="module")
def shipped_datastore(embedded):
    """The shipped datastore, loaded and indexed once for the prompts' tests."""
    return load_datastore(EMBEDDED_ANSWERS, embedded.model.config.vocab_size)


@pytest.mark.slow
@pytest.mark.parametrize("prompt", shown_prompts())
def test_every_shown_prompt_is_new_to_the_shipped_datastore(embedded, shipped_datastore, prompt):
    """AR's float32 answer of 64 tokens shares at most one in ten of its 16-token runs with the datastore."""
    store = shipped_datastore
    answer = final_summary(ar.generate(embedded.model, embedded.encode_chat(prompt), max_new_tokens=64,
                                       eos_token_ids=embedded.eos_token_ids)).tokens
    assert store.shared_windows(answer) <= MOST_SHARED, embedded.decode(answer)


def test_shared_windows_counts_runs_held_token_for_token():
    from specdemo.methods.retrieval import Datastore

    store = Datastore.of_answers([list(range(20)), [5, 5, 5, 5, 5, 5]], vocab_size=32)
    assert store.shared_windows(list(range(20)), width=16) == 1.0
    # the first 4 tokens match, the rest does not
    assert store.shared_windows([0, 1, 2, 3, *range(10, 26)], width=16) == 0.0
    assert store.shared_windows([9, *range(3, 18)], width=16) == 0.0


def near_copies(prompt: str) -> list[str]:
    """Ways a training source could hold `prompt`: itself, inside a template, and reworded at the end."""
    return [prompt, f"Please answer: {prompt} Keep it short.", f"{prompt.rstrip('.?!')}, with one example."]


def test_no_plan_takes_a_shown_prompt_or_a_near_copy_of_one():
    planted = [Prompt(text, "planted") for shown in shown_prompts() for text in near_copies(shown)]
    real = read_prompts(sorted(SHARED_TRAIN.glob("*.jsonl"))) if SHARED_TRAIN.exists() else []
    chosen = plan(real + planted, SamplingPlan(cap_per_source=10**6), bench_prompts())
    assert not any(prompt.source == "planted" for prompt in chosen)
    templates = without_bench_prompts(first_stage_prompts(0) + [p.text for p in planted], bench_prompts())
    assert not set(templates) & {p.text for p in planted} and len(templates) > 1000
