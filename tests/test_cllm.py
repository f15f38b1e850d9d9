"""CLLM: Jacobi on other weights equals AR on those weights; trajectories as decoding sees them;
adapters merge as they trained; consistency training cuts Jacobi passes; the stored CLLM loads offline."""

import copy
import random

import pytest
import torch

from specdemo import SpecDemoError
from specdemo.assets import EMBEDDED_CLLM
from specdemo.core.events import StepEvent, final_summary
from specdemo.core.steps import JacobiStep, LookaheadStep
from specdemo.methods import ar, cllm, jacobi
from training.jacobi_trajectories import batch_trajectories, block_starts, collect, trajectories
from training.train_cllm import adapter_tensors, add_adapters, remove_adapters, train_adapters

from conftest import make_tiny_model


def greedy(model, prompt_ids, max_new_tokens=40) -> list[int]:
    return list(final_summary(ar.generate(model, prompt_ids, max_new_tokens=max_new_tokens, eos_token_ids=())).tokens)


@pytest.mark.parametrize("decoder", cllm.DECODERS)
def test_cllm_equals_ar_on_its_own_weights(tiny_model, prompt_ids, decoder):
    other = make_tiny_model(seed=7)
    events = list(cllm.generate(tiny_model, prompt_ids, cllm_model=other, max_new_tokens=40, decoder=decoder,
                                block_size=8, eos_token_ids=()))
    summary = final_summary(events)
    assert list(summary.tokens) == greedy(other, prompt_ids)
    assert list(summary.tokens) != greedy(tiny_model, prompt_ids)  # not the target's answer: another model's
    assert summary.method == "cllm" and all(e.method == "cllm" for e in events[:-1])
    # the decoder's own pictures
    assert all(isinstance(e.data, {"jacobi": JacobiStep, "lookahead": LookaheadStep}[decoder]) for e in events[:-1])


def test_cllm_refuses_an_unknown_decoder(tiny_model, prompt_ids):
    with pytest.raises(SpecDemoError, match="decoder must be one of lookahead, jacobi"):
        cllm.generate(tiny_model, prompt_ids, cllm_model=tiny_model, decoder="medusa")


def test_cllm_refuses_a_model_of_another_vocabulary(tiny_model, prompt_ids):
    with pytest.raises(SpecDemoError, match="vocabulary"):
        list(cllm.generate(tiny_model, prompt_ids, cllm_model=make_tiny_model(vocab_size=50), max_new_tokens=4))


def test_trajectories_are_the_states_jacobi_decoding_feeds(tiny_model, prompt_ids):
    """All blocks iterated together in one pass each (block_states_mask) go through the states
    `specdemo.methods.jacobi` feeds block by block, and end at the greedy answer."""
    events = [e for e in jacobi.generate(tiny_model, prompt_ids, max_new_tokens=30, block_size=8, eos_token_ids=())
              if isinstance(e, StepEvent)]
    answer = greedy(tiny_model, prompt_ids, 30)
    starts = sorted({e.data.block_start for e in events})
    sequence, answer_start = prompt_ids[0].tolist() + answer, prompt_ids.shape[1]
    states = trajectories(tiny_model, sequence, answer_start, starts, 8)
    for start, block_states in zip(starts, states):
        fed = [list(e.data.state) for e in events if e.data.block_start == start]
        assert block_states[: len(fed)] == fed
        assert block_states[-1] == answer[start : start + len(block_states[-1])]


def test_merged_adapters_compute_what_the_trained_ones_did(tiny_model, prompt_ids):
    model = copy.deepcopy(tiny_model)
    adapters = add_adapters(model, rank=4, scale=2.0)
    torch.manual_seed(1)
    with torch.no_grad():
        for adapter in adapters.values():  # float16 values: the stored format loses nothing
            adapter.lora_B.copy_((torch.randn_like(adapter.lora_B) * 0.2).half().float())
            adapter.lora_A.copy_(adapter.lora_A.half().float())
        adapted = model(prompt_ids).logits
    tensors = adapter_tensors(adapters)
    remove_adapters(model, adapters)
    merged = copy.deepcopy(tiny_model)
    cllm.merge_adapters(merged, tensors, scale=2.0)
    with torch.no_grad():
        torch.testing.assert_close(merged(prompt_ids).logits, adapted, rtol=1e-4, atol=1e-4)
        assert not torch.allclose(tiny_model(prompt_ids).logits, adapted, atol=1e-3)  # the adapters did change it


@pytest.mark.slow
def test_consistency_training_cuts_jacobi_passes():
    """A short run of the consistency loss alone on a tiny model's own Jacobi trajectories makes
    Jacobi decoding of those prompts take fewer passes (CLLM's claim, in miniature)."""
    model = make_tiny_model(seed=11)
    with torch.no_grad():  # peaked next-token distributions, as a trained LM has (random init is near uniform)
        model.lm_head.weight.mul_(10.0)
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 97, (1, 6), generator=generator) for _ in range(4)]

    def passes(m) -> int:
        return sum(final_summary(jacobi.generate(m, p, max_new_tokens=32, block_size=8,
                                                 eos_token_ids=())).target_forwards for p in prompts)

    records = []
    for prompt_ids in prompts:
        sequence = prompt_ids[0].tolist() + greedy(model, prompt_ids, 32)
        starts = list(range(0, 32, 8))
        records.append({"sequence": sequence, "answer_start": 6, "block_starts": starts,
                        "states": trajectories(model, sequence, 6, starts, 8)})
    before = passes(model)
    _, history = train_adapters(model, records, epochs=30, lr=1e-2, accumulate=2, rank=8, scale=1.0, seed=0,
                                ar_weight=0.0, log_every=10)
    assert history[-1]["consistency_kl"] < 0.1 * history[0]["consistency_kl"]
    assert passes(model) < 0.5 * before


def test_stored_cllm_loads_offline_and_is_another_model(embedded):
    if not (EMBEDDED_CLLM / cllm.ADAPTER_FILE).exists():
        pytest.fail(f"the CLLM adapters are missing from {EMBEDDED_CLLM}: run python -m training.train_cllm")
    model = cllm.load_cllm(EMBEDDED_CLLM, embedded)
    assert model is not embedded.model
    base = dict(embedded.model.named_parameters())
    changed = [name for name, p in model.named_parameters() if not torch.equal(p, base[name])]
    assert changed and all(name.endswith("proj.weight") for name in changed)


def test_a_published_cllm_loads_through_the_model_path(embedded):
    """A Hub CLLM (a whole model) goes through specdemo.models: offline here, so it fails with
    that loader's sentence, not with an adapter error."""
    with pytest.raises(SpecDemoError, match="could not load model 'cllm/consistency-llm-7b-sharegpt48k'"):
        cllm.load_cllm("cllm/consistency-llm-7b-sharegpt48k", embedded)


@pytest.mark.slow
def test_cllm_equals_its_own_ar_on_embedded_model(embedded):
    from specdemo.methods import method_options

    cllm_model = method_options("cllm", embedded)["cllm_model"]
    input_ids = embedded.encode_chat("Name three uses of a paperclip.")
    expected = final_summary(ar.generate(cllm_model, input_ids, max_new_tokens=48,
                                         eos_token_ids=embedded.eos_token_ids)).tokens
    summary = final_summary(cllm.generate(embedded.model, input_ids, cllm_model=cllm_model, max_new_tokens=48,
                                          eos_token_ids=embedded.eos_token_ids))
    assert summary.tokens == expected
    assert len(summary.tokens) / summary.target_forwards > 1.0


def test_the_base_anchor_is_the_model_with_its_adapters_off(tiny_model, prompt_ids):
    """`--ar-loss base`: the AR loss's target is the frozen base model's distribution, computed by
    the adapted model with its adapters off, which are on again after; zero when the two agree."""
    from training.train_cllm import base_logits, cllm_loss

    model = copy.deepcopy(tiny_model)
    adapters = add_adapters(model, rank=4, scale=2.0)
    with torch.no_grad():
        for adapter in adapters.values():
            adapter.lora_B.normal_(std=0.2)
        adapted = model(prompt_ids).logits
    sequence = prompt_ids[0].tolist() + greedy(tiny_model, prompt_ids, 12)
    starts = [0, 6]
    record = {"sequence": sequence, "answer_start": prompt_ids.shape[1], "block_starts": starts,
              "states": trajectories(tiny_model, sequence, prompt_ids.shape[1], starts, 6)}
    base = base_logits(model, adapters, [record])[0]
    with torch.no_grad():
        expected = tiny_model(torch.tensor([sequence])).logits[0, prompt_ids.shape[1] - 1 : -1]
        torch.testing.assert_close(base, expected, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(model(prompt_ids).logits, adapted)  # adapters back on
    loss, parts = cllm_loss(model, record, random.Random(0), ar_weight=1.0, base=base)
    entropy = -(torch.softmax(base, -1) * torch.log_softmax(base, -1)).sum(-1).mean()
    assert parts["ar"] > entropy.item() + 1e-3  # the adapters moved it away from the base
    for adapter in adapters.values():
        adapter.scale = 0.0
    _, parts = cllm_loss(model, record, random.Random(0), ar_weight=1.0, base=base)
    assert abs(parts["ar"] - entropy.item()) < 1e-4  # cross-entropy to itself: its entropy


def test_pick_states_never_picks_the_fixed_point():
    from training.train_cllm import pick_states

    record = {"answer_start": 3, "block_starts": [0, 4], "states": [[[1, 1], [5, 6]], [[7]]]}
    assert pick_states(record, random.Random(0)) == [(3, [1, 1])]


def test_trajectories_collected_in_parts_are_those_of_one_run(tiny_model, prompt_ids):
    """`jacobi_trajectories --part K/N` splits the answers between processes side by side and
    `--merge` joins them: the records are those one process collects, and a time budget keeps the
    answers done when it is spent."""
    answers = {i: prompt_ids[0].tolist() + greedy(tiny_model, prompt_ids[:, : 3 + i], 20) for i in range(4)}
    data = {"sequences": {i: seq for i, seq in answers.items()},
            "answer_starts": {i: prompt_ids.shape[1] for i in answers}}
    work = [(i, i % 8) for i in answers]
    whole = collect(tiny_model, data, work, 8, None)
    parts = collect(tiny_model, data, work[0::2], 8, None) + collect(tiny_model, data, work[1::2], 8, None)
    assert sorted(parts, key=lambda r: r["id"]) == whole
    assert collect(tiny_model, data, work, 8, None, batch_size=3) == whole
    assert [r["id"] for r in collect(tiny_model, data, work, 8, 1e-9)] == [0]


def test_trajectories_of_a_batch_are_each_answers_own(tiny_model):
    """Answers of different lengths, left-padded into one cache and iterated together, go through
    exactly the states each goes through alone (a padding bug would poison the data silently)."""
    generator = torch.Generator().manual_seed(3)
    answers = []
    for length, n_new in ((5, 30), (9, 21), (3, 40)):
        prompt = torch.randint(3, 97, (1, length), generator=generator)
        sequence = prompt[0].tolist() + greedy(tiny_model, prompt, n_new)
        answers.append((sequence, length, block_starts(n_new, 8, 3 + length % 5)))
    alone = [trajectories(tiny_model, *answer, 8) for answer in answers]
    assert batch_trajectories(tiny_model, answers, 8) == alone
    assert sum(len(states) > 2 for row in alone for states in row) >= 3  # blocks did iterate


@pytest.mark.slow
def test_trajectories_of_a_batch_on_the_embedded_model(embedded):
    """The same on the embedded model: two answers of different lengths, alone and together."""
    answers = []
    for text in ("Name three colours.", "Why is the sky blue? Answer in one sentence."):
        prompt = embedded.encode_chat(text)
        answer = greedy(embedded.model, prompt, 40)
        answers.append((prompt[0].tolist() + answer, prompt.shape[1], block_starts(len(answer), 16, 5)))
    alone = [trajectories(embedded.model, *answer, 16) for answer in answers]
    assert batch_trajectories(embedded.model, answers, 16) == alone


def test_answers_packed_into_one_pass_give_each_ones_loss_and_gradient(tiny_model):
    """`cllm_losses` packs a step's answers into one pass with a block-diagonal mask (fewer kernel
    launches on a GPU): each answer's loss, and the step's gradient, are those of one pass each."""
    from training.train_cllm import base_logits, cllm_loss, cllm_losses

    generator = torch.Generator().manual_seed(5)
    records = []
    for length, n_new in ((4, 18), (7, 12), (5, 24)):
        prompt = torch.randint(3, 97, (1, length), generator=generator)
        sequence = prompt[0].tolist() + greedy(tiny_model, prompt, n_new)
        starts = block_starts(n_new, 6, 2)
        records.append({"sequence": sequence, "answer_start": length, "block_starts": starts,
                        "states": trajectories(tiny_model, sequence, length, starts, 6)})
    model = copy.deepcopy(tiny_model)
    adapters = add_adapters(model, rank=4, scale=2.0)
    with torch.no_grad():
        for adapter in adapters.values():
            adapter.lora_B.normal_(std=0.2)
    parameters = [p for adapter in adapters.values() for p in (adapter.lora_A, adapter.lora_B)]

    def gradient(losses):
        for p in parameters:
            p.grad = None
        sum(loss for loss, _ in losses).backward()
        return [p.grad.clone() for p in parameters]

    bases = base_logits(model, adapters, records)
    for base, record in zip(bases, records):
        torch.testing.assert_close(base, base_logits(model, adapters, [record])[0], rtol=1e-5, atol=1e-5)
    rng = random.Random(0)
    alone = [cllm_loss(model, record, rng, ar_weight=2.0, base=base) for record, base in zip(records, bases)]
    together = cllm_losses(model, records, random.Random(0), ar_weight=2.0, bases=bases)
    assert [parts["positions"] for _, parts in together] == [parts["positions"] for _, parts in alone] \
        and alone[0][1]["positions"]
    for (a, _), (b, _) in zip(alone, together):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    for a, b in zip(gradient(alone), gradient(together)):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    trained = []
    for answers_a_pass in (1, 3):  # the same steps whether a step's answers share a pass or not
        model = copy.deepcopy(tiny_model)
        adapters, _ = train_adapters(model, records, epochs=2, lr=1e-2, accumulate=3, rank=4, scale=1.0, seed=0,
                                     ar_loss="base", log_every=1, answers_a_pass=answers_a_pass)
        trained.append(adapter_tensors(adapters))
    for name, tensor in trained[0].items():
        torch.testing.assert_close(trained[1][name], tensor, rtol=1e-3, atol=1e-4)
