"""Chat prompts the target writes itself (training/magpie.py, Magpie): the user-turn prefix, seeded
and resumable sampling, and a plan that keeps the shared sources' sample when they join it."""

import json
from types import SimpleNamespace

import pytest
import torch

from training import magpie
from training.real_prompts import Prompt, SamplingPlan, plan

from conftest import make_tiny_model


def test_the_prefix_ends_where_a_users_words_begin(embedded):
    prefix, end = magpie.user_turn(embedded)
    text = embedded.tokenizer.decode(prefix)
    assert text.endswith("<|im_start|>user\n") and "<|im_start|>assistant" not in text
    assert embedded.tokenizer.convert_ids_to_tokens(end) == "<|im_end|>"
    chat = embedded.encode_chat("Plan a picnic.")[0].tolist()
    assert chat[: len(prefix)] == prefix and end in chat[len(prefix):]


END = 5  # the tiny stand-in's end-of-turn token


def tiny_target():
    """A tiny random model behind the chat prefix [1, 2, 3]: a row ends its request with END (about
    one in 97 tokens); a token decodes as a word, so a request of n tokens holds n words."""
    model = make_tiny_model(seed=3)
    tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens=True: " ".join(f"w{i}" for i in ids))
    return SimpleNamespace(model=model, device=torch.device("cpu"), tokenizer=tokenizer)


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setattr(magpie, "user_turn", lambda target: ([1, 2, 3], END))
    return tiny_target()


def test_requests_are_seeded_by_batch_and_end_their_turn(tiny):
    first = magpie.sample_requests(tiny, batch=0, size=16, seed=0, max_new_tokens=80, temperature=1.0, top_p=1.0)
    assert first and all(len(text.split()) >= magpie.MIN_WORDS and f"w{END}" not in text.split() for text in first)
    assert magpie.sample_requests(tiny, batch=0, size=16, seed=0, max_new_tokens=80, temperature=1.0,
                                  top_p=1.0) == first
    assert magpie.sample_requests(tiny, batch=1, size=16, seed=0, max_new_tokens=80, temperature=1.0,
                                  top_p=1.0) != first
    assert magpie.sample_requests(tiny, batch=0, size=16, seed=1, max_new_tokens=80, temperature=1.0,
                                  top_p=1.0) != first
    # too short
    assert len(magpie.sample_requests(tiny, batch=0, size=16, seed=0, max_new_tokens=3, temperature=1.0,
                                      top_p=1.0)) == 0


def test_a_killed_run_resumes_after_its_last_batch_and_writes_what_a_whole_run_writes(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(magpie, "load_model", lambda *args: tiny)
    flags = ["--batch-size", "8", "--max-new-tokens", "80"]
    magpie.main(["--count", "3", "--out", str(tmp_path / "part.jsonl"), *flags])
    partial = (tmp_path / "part.jsonl").read_text().splitlines()
    magpie.main(["--count", "12", "--out", str(tmp_path / "part.jsonl"), *flags])  # resumes
    magpie.main(["--count", "12", "--out", str(tmp_path / "whole.jsonl"), *flags])
    resumed = (tmp_path / "part.jsonl").read_text().splitlines()
    assert resumed[: len(partial)] == partial and len(resumed) >= 12 > len(partial)
    assert resumed == (tmp_path / "whole.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in resumed]
    assert len({r["prompt"] for r in records}) == len(records)  # once each
    assert {r["source"] for r in records} == {f"{magpie.SOURCE}/magpie-embedded"}
    assert [r["batch"] for r in records] == sorted(r["batch"] for r in records)


def test_adding_the_written_prompts_to_a_plan_leaves_the_shared_sample_unchanged():
    """`plan` shuffles source after source with one generator: a source sorting before the shared
    ones would change which of them it draws, and an earlier run's answers could not be reused."""
    shared = [Prompt(f"question {i} of {source}", source)
              for source in ("gsm8k", "self_instruct/seed", "t0/a", "t0/zz_last") for i in range(30)]
    written = [Prompt(f"request {i}", f"{magpie.SOURCE}/magpie-embedded") for i in range(30)]
    sampling = SamplingPlan(cap_per_source=7, caps=((magpie.SOURCE, 20),), seed=2)
    alone = plan(shared, sampling, bench=[])
    together = plan(shared + written, sampling, bench=[])
    assert set(alone) == {p for p in together if p in set(shared)}
    assert sum(p.source.startswith(magpie.SOURCE) for p in together) == 20


def test_a_manifest_remakes_the_written_prompts_before_the_answers(tmp_path):
    """The command that writes a magpie prompt file again, with the file's count (the run stops after
    the batch that reaches it: the same file), for `distill.command` to put before its own."""
    mine, other = tmp_path / "magpie.jsonl", tmp_path / "other.jsonl"
    mine.write_text("".join(json.dumps({"prompt": f"p{i}", "source": f"{magpie.SOURCE}/magpie-embedded",
                                        "batch": 0}) + "\n" for i in range(7)))
    other.write_text(json.dumps({"prompt": "q", "source": "mine"}) + "\n")
    assert magpie.remake_command(str(mine)) == f".venv/bin/python -m training.magpie --count 7 --out {mine}"
    assert magpie.remake_command(str(other)) is None and magpie.remake_command(str(tmp_path / "gone.jsonl")) is None
    gpu = tmp_path / "gpu.jsonl"  # a file sampled in batches of another size is another file: the command says the size
    gpu.write_text("".join(json.dumps({"prompt": f"p{i}", "source": f"{magpie.SOURCE}/magpie-embedded", "batch": 0,
                                       "batch_size": 2048}) + "\n"
                           for i in range(3)))
    assert magpie.remake_command(str(gpu)) == \
        f".venv/bin/python -m training.magpie --count 3 --batch-size 2048 --out {gpu}"
