"""Batched self-distillation (training/distill.py, selfdistill.batch_decode) and the real-prompt
reader and sampling plan (training/real_prompts.py). A padding bug would poison the training data
silently, so the batched answers are checked token for token against unbatched greedy decoding."""

import functools
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specdemo.methods import ar
from training import carry, distill
from training.real_prompts import (
    SHARED_TRAIN,
    Prompt,
    SamplingPlan,
    bench_prompts,
    mixed_in,
    plan,
    read_prompts,
    unseen,
    word_runs,
)
from training.selfdistill import batch_decode

from conftest import make_tiny_model


def tiny_target(eos: int = 3):
    """A stand-in for LoadedModel around a tiny random model: what batch_decode reads."""
    model = make_tiny_model(seed=1)
    return SimpleNamespace(model=model, device=torch.device("cpu"), eos_token_ids=(eos,),
                           tokenizer=SimpleNamespace(pad_token_id=0),
                           encode_chat=lambda text: torch.tensor([[1 + (ord(c) % 90) for c in text]]))


def greedy_alone(model, prompt: list[int], max_new_tokens: int, eos: tuple[int, ...]) -> list[int]:
    tokens = []
    for event in ar.generate(model, torch.tensor([prompt]), max_new_tokens=max_new_tokens, eos_token_ids=eos):
        tokens += list(getattr(event, "committed", []))
    return tokens


def test_batched_greedy_equals_unbatched_on_a_tiny_model():
    target = tiny_target()
    prompts = [[5, 17, 42], [8, 63, 21, 9, 11, 30, 2, 77], [40], [12, 12, 12, 12, 12]]
    for (answer, features), prompt in zip(batch_decode(target, prompts, 24, features=True), prompts):
        assert answer == greedy_alone(target.model, prompt, 24, target.eos_token_ids)
        full = target.model.get_decoder()(input_ids=torch.tensor([prompt + answer])).last_hidden_state[0]
        assert features.shape == (len(prompt) + len(answer) - 1, full.shape[-1])
        torch.testing.assert_close(features, full[:-1], atol=1e-4, rtol=1e-4)


def test_a_row_that_ends_leaves_the_batch_and_the_others_go_on():
    target = tiny_target()
    prompts = [[5, 17, 42], [8, 63, 21, 9], [40, 2]]
    reference = [greedy_alone(target.model, p, 30, ()) for p in prompts]
    eos = reference[1][4]  # a token the second answer reaches early: that row ends there
    target.eos_token_ids = (eos,)
    answers = [answer for answer, _ in batch_decode(target, prompts, 30)]
    assert answers == [greedy_alone(target.model, prompt, 30, (eos,)) for prompt in prompts]
    assert answers[1][-1] == eos and len(answers[1]) <= 5 and max(map(len, answers)) > 5


def test_sampled_answers_follow_the_seed():
    target = tiny_target()
    prompts = [[5, 17, 42], [8, 63]]
    first = batch_decode(target, prompts, 12, temperature=1.0, generator=torch.Generator().manual_seed(3))
    again = batch_decode(target, prompts, 12, temperature=1.0, generator=torch.Generator().manual_seed(3))
    other = batch_decode(target, prompts, 12, temperature=1.0, generator=torch.Generator().manual_seed(4))
    assert [a for a, _ in first] == [a for a, _ in again] != [a for a, _ in other]


@pytest.mark.slow
def test_batched_greedy_equals_unbatched_on_the_embedded_model(embedded):
    texts = ["Hi!", "Explain gravity in two sentences to a child.", "What is 17 times 23?"]
    prompts = [embedded.encode_chat(text)[0].tolist() for text in texts]
    for (answer, _), prompt in zip(batch_decode(embedded, prompts, 20), prompts):
        assert answer == greedy_alone(embedded.model, prompt, 20, embedded.eos_token_ids)


def test_shards_resume_and_refuse_another_plan(tmp_path, monkeypatch):
    target = tiny_target()
    prompts = [Prompt(text, "test") for text in ["abc", "hello there", "x", "a longer prompt", "zz"]]
    settings = {"seed": 0, "temperature": 0.0, "max_new_tokens": 6}
    distill.run(target, prompts, tmp_path, settings, shard_size=2, batch_size=2)
    data = distill.load_shards(tmp_path)
    assert data["prompts"] == [p.text for p in prompts] and len(data["features"]) == 5
    for sequence, start, features in zip(data["sequences"], data["answer_starts"], data["features"]):
        assert len(features) == len(sequence) - 1 and 0 < start < len(sequence)
    distill.shard_path(tmp_path, 1).unlink()
    answered = []
    real = distill.answer_shard
    monkeypatch.setattr(distill, "answer_shard", lambda t, ps, *a, **k: answered.append(ps) or real(t, ps, *a, **k))
    distill.run(target, prompts, tmp_path, settings, shard_size=2, batch_size=2)
    assert answered == [prompts[2:4]]  # only the missing shard is answered again
    assert distill.load_shards(tmp_path)["sequences"] == data["sequences"]
    with pytest.raises(SystemExit, match="another plan"):
        distill.run(target, prompts, tmp_path, {**settings, "temperature": 0.8}, shard_size=2, batch_size=2)


def test_carried_tokens_restore_the_shards_their_features_from_a_full_pass(tmp_path):
    """What a lent GPU sends back (`carry.save`: tokens, no features) makes the same shards again."""
    target = tiny_target()
    prompts = [Prompt(text, f"source{len(text) % 2}") for text in ["abc", "hello there", "x", "a longer prompt", "zz"]]
    distill.run(target, prompts, tmp_path / "made",
                {"seed": 0, "temperature": 0.0, "max_new_tokens": 6, "dtype": "float32"},
                shard_size=2, batch_size=2)
    carry.save(tmp_path / "made", tmp_path / "tokens.pt.xz")
    carry.restore(tmp_path / "tokens.pt.xz", tmp_path / "restored", target)
    made, restored = distill.load_shards(tmp_path / "made"), distill.load_shards(tmp_path / "restored")
    assert sorted(p.name for p in (tmp_path / "restored").iterdir()) == \
        sorted(p.name for p in (tmp_path / "made").iterdir())
    assert (tmp_path / "restored" / "plan.json").read_text() == (tmp_path / "made" / "plan.json").read_text()
    for key in ("prompts", "sources", "sequences", "answer_starts"):
        assert restored[key] == made[key]
    for a, b in zip(made["features"], restored["features"]):  # both bfloat16: one rounding step apart at most
        assert a.shape == b.shape and a.dtype == b.dtype == torch.bfloat16
        torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)
    carry.restore(tmp_path / "tokens.pt.xz", tmp_path / "first3", target, limit=3)  # the plan's first answers only
    first3 = distill.load_shards(tmp_path / "first3")
    for key in ("prompts", "sources", "sequences", "answer_starts"):
        assert first3[key] == made[key][:3]


def test_a_larger_plan_reuses_the_greedy_answers_of_an_earlier_run(tmp_path, monkeypatch):
    target = tiny_target()
    prompts = [Prompt(text, "test") for text in ["abc", "hello there", "x", "a longer prompt", "zz"]]
    settings = {"seed": 0, "temperature": 0.0, "max_new_tokens": 6}
    distill.run(target, prompts[:3], tmp_path / "small", settings, shard_size=2, batch_size=2)
    distill.run(target, prompts, tmp_path / "fresh", settings, shard_size=2, batch_size=2)
    decoded = []
    real = distill.batch_decode
    monkeypatch.setattr(distill, "batch_decode",
                        lambda t, rows, *a, **k: decoded.extend(rows) or real(t, rows, *a, **k))
    distill.run(target, prompts[::-1], tmp_path / "large", settings, shard_size=2, batch_size=2,
                reuse=[tmp_path / "small"])
    # only the new prompts
    assert sorted(decoded) == sorted(target.encode_chat(p.text)[0].tolist() for p in prompts[3:])
    fresh, large = distill.load_shards(tmp_path / "fresh"), distill.load_shards(tmp_path / "large")
    assert large["sequences"] == fresh["sequences"][::-1]
    assert all(torch.allclose(a.float(), b.float(), atol=1e-2)
               for a, b in zip(large["features"], fresh["features"][::-1]))
    with pytest.raises(SystemExit, match="not this run's settings"):
        distill.run(target, prompts, tmp_path / "other", {**settings, "max_new_tokens": 7}, shard_size=2, batch_size=2,
                    reuse=[tmp_path / "small"])


def test_the_recorded_command_remakes_the_plan(tmp_path):
    """The distill command a manifest prints plans the same prompts with the same settings."""
    target = tiny_target()
    prompts = [Prompt(text, "test") for text in ["abc", "hello there"]]
    sampling = SamplingPlan(cap_per_source=7, caps=(("gsm8k", 4000),), max_chars=900, limit=None, seed=3)
    settings = {"plan": {**vars(sampling), "caps": [list(c) for c in sampling.caps]}, "files": ["a.jsonl"],
                "seed": 5, "temperature": 0.7, "max_new_tokens": 9, "dtype": "float32"}
    distill.run(target, prompts, tmp_path, settings, shard_size=1, batch_size=1)
    data = distill.load_shards(tmp_path)
    data["prompts"] = data["prompts"][:1]  # a run stopped after its first shard
    words = distill.command(tmp_path, data).split()
    assert words[:5] == [".venv/bin/python", "-m", "training.distill", "--prompts", "../shared/train/*.jsonl"]
    parser = distill.argparse.ArgumentParser()
    distill.add_arguments(parser)
    for extra in ("--seed", "--temperature", "--max-new-tokens"):
        parser.add_argument(extra, type=float if extra == "--temperature" else int)
    parser.add_argument("--out", type=distill.Path, default=distill.DEFAULT_OUT)
    args = parser.parse_args(words[3:])
    assert distill.sampling_plan(args) == SamplingPlan(7, (("gsm8k", 4000),), 900, 1, 3)
    assert (args.seed, args.temperature, args.max_new_tokens, args.out) == (5, 0.7, 9, tmp_path)
    assert not args.templates
    recorded = distill.json.loads((tmp_path / "plan.json").read_text())
    (tmp_path / "plan.json").write_text(distill.json.dumps(
        {**recorded, **distill.own_files([tmp_path / "mine.jsonl", distill.SHARED_TRAIN / "a.jsonl"])}))
    words = distill.command(tmp_path, data).split()  # a prompt file of our own follows the shared ones
    assert words[3:6] == ["--prompts", "../shared/train/*.jsonl", str(tmp_path / "mine.jsonl")]
    assert distill.own_files([distill.SHARED_TRAIN / "a.jsonl"]) == {}


def test_template_prompts_mix_into_every_shard_and_the_command_says_so(tmp_path):
    """--templates: our template prompts join the planned ones, shuffled by the plan's seed, and
    the recorded command asks for them again."""
    real = [Prompt(f"real {i}", "t0/x") for i in range(20)]
    mixed = mixed_in(real, [f"template {i}" for i in range(20)], "templates", seed=4)
    assert sorted(p.text for p in mixed) == sorted([p.text for p in real] + [f"template {i}" for i in range(20)])
    assert mixed == mixed_in(real, [f"template {i}" for i in range(20)], "templates", seed=4)
    assert all({p.source for p in mixed[i : i + 10]} == {"t0/x", "templates"} for i in (0, 10, 20, 30))
    settings = {"plan": {**vars(SamplingPlan()), "caps": []}, "files": ["a.jsonl"], "seed": 0, "temperature": 0.0,
                "max_new_tokens": 4, "dtype": "float32", "templates": True}
    distill.run(tiny_target(), mixed[:2], tmp_path, settings, shard_size=2, batch_size=2)
    data = distill.load_shards(tmp_path)
    assert "--templates" in distill.command(tmp_path, data).split()
    assert "our template prompts" in distill.describe(tmp_path, data, [0, 1])
    plan_json = distill.json.loads((tmp_path / "plan.json").read_text())  # a plan of its own limit, answered whole
    (tmp_path / "plan.json").write_text(distill.json.dumps({**plan_json, "plan": {**plan_json["plan"], "limit": 1}}))
    words = distill.command(tmp_path, data).split()
    assert words[words.index("--limit") + 1] == "1"


def test_prompt_reader_and_sampling_plan(tmp_path):
    lines = [{"prompt": f"question {i} " + "word " * (i % 7), "source": "a/x" if i % 3 else "b"} for i in range(60)]
    lines.append({"prompt": "too long " * 100, "source": "a/x"})
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    prompts = read_prompts([path])
    assert len(prompts) == 61 and prompts[0] == Prompt(lines[0]["prompt"], "b")
    sampling = SamplingPlan(cap_per_source=5, caps=(("b", 8),), max_chars=200, seed=1)
    chosen = plan(prompts, sampling, bench=[])
    assert sum(p.source == "a/x" for p in chosen) == 5 and sum(p.source == "b" for p in chosen) == 8
    assert all(len(p.text) <= 200 for p in chosen)
    assert plan(prompts, sampling, bench=[]) == chosen  # seeded
    assert plan(prompts, SamplingPlan(5, (("b", 8),), 200, None, 2), bench=[]) != chosen
    assert len(plan(prompts, SamplingPlan(5, (("b", 8),), 200, 4, 1), bench=[])) == 4
    bench = ["please answer " + lines[1]["prompt"] + " now, in ten more words of text"]
    assert all(p.text != lines[1]["prompt"]
               for p in plan(prompts, SamplingPlan(100, (), 200), bench=[lines[1]["prompt"]]))
    near = Prompt("one two three four five six seven eight nine ten eleven", "a/x")
    assert plan([near], SamplingPlan(), bench=["zero one two three four five six seven eight nine ten"]) == []
    assert plan([near], SamplingPlan(), bench=bench) == [near]


def test_a_fine_tune_holds_out_none_of_the_prompts_its_start_trained_on():
    prompts = [f"prompt {i}" for i in range(50)]
    ids = list(range(50))
    random.Random(0).shuffle(ids)
    assert distill.held_out_ids(prompts, 10, seed=0) == sorted(ids[:10])  # nothing excluded: the seeded shuffle's first
    trained = frozenset(prompts[:40])
    held = distill.held_out_ids(prompts, 5, seed=0, trained=trained)
    assert len(held) == 5 and all(i >= 40 for i in held) \
        and held == distill.held_out_ids(prompts, 5, seed=0, trained=trained)
    assert distill.held_out_ids(prompts, 20, seed=0, trained=trained) == list(range(40, 50))  # fewer left than asked


def test_a_fine_tune_of_a_run_holds_out_only_what_that_run_held_out(tmp_path):
    """`trained_on` a run's shards, then a larger plan's split: its held-out prompts are the earlier
    run's held-out ones and prompts that run never saw."""
    def write(folder, texts):
        folder.mkdir()
        torch.save({"prompts": texts, "sources": ["s"] * len(texts), "sequences": [[1, 2]] * len(texts),
                    "answer_starts": [1] * len(texts), "features": [torch.zeros(1, 4)] * len(texts)},
                   distill.shard_path(folder, 0))
    earlier = [f"old {i}" for i in range(30)]
    write(tmp_path / "earlier", earlier)
    trained = distill.trained_on(tmp_path / "earlier", 5, seed=0)
    assert len(trained) == 25 and trained < set(earlier)
    (tmp_path / "asset").mkdir()  # an asset trained on those shards names them in its report
    report = {"args": {"distill_out": str(tmp_path / "earlier"), "held_out": "5", "seed": "0"}}
    (tmp_path / "asset" / "training_report.json").write_text(json.dumps(report))
    assert distill.trained_by(tmp_path / "asset") == trained
    write(tmp_path / "larger", [f"new {i}" for i in range(10)] + earlier)
    data, train_ids, held = distill.load_split(tmp_path / "larger", 8, seed=1, trained=trained)
    assert len(held) == 8 and not {data["prompts"][i] for i in held} & trained
    assert sorted(train_ids + held) == list(range(40))


def test_a_start_whose_shard_folder_grew_since_is_redrawn_over_the_answers_it_saw(tmp_path):
    """The start trained on the 30 answers its folder held; the folder then grew to 60 (a larger
    `--limit` of the same plan appends). Its split is redrawn over the first 30, as its report's
    counts say, not over all 60 (another split, which would let its training prompts be held out)."""
    folder = tmp_path / "shards"
    folder.mkdir()
    texts = [f"prompt {i}" for i in range(60)]

    def save(number, chunk):
        torch.save({"prompts": chunk, "sources": ["s"] * len(chunk), "sequences": [[1, 2]] * len(chunk),
                    "answer_starts": [1] * len(chunk),
                    "features": [torch.zeros(1, 4)] * len(chunk)}, distill.shard_path(folder, number))

    save(0, texts[:30])
    trained = distill.trained_on(folder, 5, seed=0)
    (tmp_path / "asset").mkdir()
    report = {"args": {"distill_out": str(folder), "held_out": "5", "seed": "0"}, "train_sequences": 25,
              "held_out_sequences": 5}
    (tmp_path / "asset" / "training_report.json").write_text(json.dumps(report))
    save(1, texts[30:])
    assert distill.trained_by(tmp_path / "asset") == trained
    assert distill.trained_on(folder, 5, seed=0) != trained  # the grown folder's own split differs
    report["args"]["train_limit"] = "10"  # it trained on 10 of the 25: its counts say nothing of what it saw
    (tmp_path / "asset" / "training_report.json").write_text(json.dumps(report))
    assert distill.trained_by(tmp_path / "asset") == distill.trained_on(folder, 5, seed=0)


def test_a_fine_tune_of_a_fine_tune_holds_out_nothing_any_earlier_link_trained_on(tmp_path):
    """A trains on its shards; B fine-tunes A on the same shards, holding out none of what A trained on;
    C fine-tunes B. B's report names what A and B trained on (`chain_digests`), so C's held-out
    prompts are unseen by both, where B's shards alone would name only B's own split."""
    texts = [f"prompt {i}" for i in range(40)]
    folder = tmp_path / "shards"
    folder.mkdir()
    torch.save({"prompts": texts, "sources": ["s"] * 40, "sequences": [[1, 2]] * 40, "answer_starts": [1] * 40,
                "features": [torch.zeros(1, 4)] * 40}, distill.shard_path(folder, 0))

    def train(name: str, seed: int, start: Path | None) -> tuple[Path, set[str]]:
        trained = functools.partial(distill.trained_by, start) if start else frozenset()
        data, train_ids, held = distill.load_split(folder, 5, seed, trained)
        asset = tmp_path / name
        asset.mkdir()
        report = {"args": {"distill_out": str(folder), "held_out": "5", "seed": str(seed)},
                  "trained_prompts": distill.chain_digests([data["prompts"][i] for i in train_ids], start)}
        (asset / "training_report.json").write_text(json.dumps(report))
        return asset, {texts[i] for i in train_ids}

    a, by_a = train("a", seed=0, start=None)
    b, by_b = train("b", seed=1, start=a)
    data, _, held = distill.load_split(folder, 5, seed=2, trained=functools.partial(distill.trained_by, b))
    assert len(held) == 5 and not {texts[i] for i in held} & (by_a | by_b)
    assert distill.trained_by(b, {"prompts": texts}) == by_a | by_b
    # B's shards alone: its split redrawn, A's training forgotten
    assert not by_a <= distill.trained_on(folder, 5, seed=1)
    assert len(json.loads((b / "training_report.json").read_text())["trained_prompts"][0]) == 16


def test_a_fine_tune_whose_start_lost_its_shards_holds_out_none_of_its_plan(tmp_path):
    """The start's shards are gone: its plan's real prompts are drawn again from the recorded files
    and plan, and every template prompt of this run counts as trained (their texts come from the
    target's passages); the held-out prompts are none of them."""
    texts = [f"a real prompt number {i}" for i in range(40)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": t, "source": f"src{i % 2}"}) + "\n"
                                              for i, t in enumerate(texts)))
    (tmp_path / "asset").mkdir()
    report = {"args": {"distill_out": str(tmp_path / "gone"), "held_out": "5", "seed": "0",
                       "prompts": f"[PosixPath('{tmp_path / 'p.jsonl'}')]",
                       "cap_per_source": "6", "cap": "['src1=4']", "max_chars": "1500", "limit": "None",
                       "plan_seed": "3", "templates": "True"}}
    (tmp_path / "asset" / "training_report.json").write_text(json.dumps(report))
    drawn = {p.text
             for p in plan(read_prompts([tmp_path / "p.jsonl"]), SamplingPlan(6, (("src1", 4),), 1500, None, 3), [])}
    assert len(drawn) == 10
    data = {"prompts": [*texts, "a template"], "sources": [*(["src"] * 40), "templates"]}
    assert distill.trained_by(tmp_path / "asset", data) == drawn | {"a template"}
    assert distill.trained_by(tmp_path / "asset") == drawn


def test_a_chain_of_fine_tunes_keeps_every_manifest(tmp_path):
    """A fine-tune's MANIFEST-start.md holds its start's manifest and, when the start was a fine-tune
    too, that one's start, so the commands go back to the training from scratch."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    (first / "MANIFEST.md").write_text("trained from scratch: command A\n")
    assert distill.start_manifest(first) == "trained from scratch: command A\n"
    (second / "MANIFEST.md").write_text("fine-tuned: command B\n")
    (second / "MANIFEST-start.md").write_text(distill.start_manifest(first))
    kept = distill.start_manifest(second)
    assert kept.index("command B") < kept.index("command A")


def test_unseen_prompts_come_from_the_same_sources_and_none_from_the_plan():
    """The CLLM's quality check measures on these: a plan answered whole leaves no held-out end of it."""
    prompts = [Prompt(f"question {i} of {source}", source) for source in ("a/x", "a/y", "b") for i in range(40)]
    sampling = SamplingPlan(cap_per_source=10, caps=(("b", 30),), seed=3)
    taken = {p.text for p in plan(prompts, sampling, bench=[])}
    held = unseen(prompts, sampling, [], count=15)
    assert len(held) == 15 and not taken & {p.text for p in held}
    assert {p.source for p in held} <= {"a/x", "a/y", "b"} and len({p.source for p in held}) > 1
    assert unseen(prompts, sampling, [], count=15) == held  # seeded
    assert unseen(prompts, SamplingPlan(cap_per_source=40, seed=3), [], count=25) == []  # the plan took every prompt


@pytest.mark.skipif(not SHARED_TRAIN.exists(), reason="no ../shared/train beside the project")
def test_no_planned_training_prompt_is_or_nearly_copies_a_bench_prompt():
    """The default plan over the shared prompts, against our bench prompts and Spec-Bench's."""
    args = SimpleNamespace(cap_per_source=30, cap=["gsm8k=2000"], max_chars=1500, limit=None, plan_seed=0)
    chosen = plan(read_prompts(sorted(SHARED_TRAIN.glob("*.jsonl"))), distill.sampling_plan(args), bench_prompts())
    assert len(chosen) > 5000
    bench = bench_prompts()
    bench_runs = set().union(*(word_runs(text) for text in bench))
    assert not {p.text.strip() for p in chosen} & {text.strip() for text in bench}
    assert not [p.text for p in chosen if word_runs(p.text) & bench_runs]
