"""Medusa: the tree mask against a brute-force reference, a tree pass against separate paths,
KV compaction, greedy equality with AR, and the published heads format."""

import json

import numpy as np
import pytest
import torch
from transformers import DynamicCache

from specdemo import SpecDemoError
from specdemo.core.attention import additive_mask, chain_positions
from specdemo.core.events import StepEvent, final_summary
from specdemo.core.kvcache import keep_positions
from specdemo.core.sampling import SamplingConfig
from specdemo.core.verify import accept_greedy, deepest, leaf_paths, path_to, read_with_choices, tree_mask
from specdemo.methods import ar, medusa, medusa_heads, medusa_tree
from specdemo.methods.medusa import probs_after_parents, typical_verdicts
from specdemo.methods.medusa_heads import MedusaHeads, load_heads
from specdemo.methods.medusa_tree import build_tree, dynamic_paths, rank_paths, top_ranks

CHOICES = [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (2,)]


def test_tree_mask_and_positions_match_the_reference():
    tree = build_tree(CHOICES)  # a shape: each node's token is its rank
    nodes = list(rank_paths(tree))  # the root (parent -1) is the last committed token, at position 10
    assert nodes == sorted(CHOICES, key=lambda path: (len(path), path)) and tree.sources == ("head",) * len(CHOICES)
    assert tree.tokens == tuple(path[-1] for path in nodes)
    assert all((nodes[parent] if parent >= 0 else ()) == nodes[node][:-1] for node, parent in enumerate(tree.parents))
    reference = np.array([[b == a[: len(b)] for b in nodes] for a in nodes])  # each node sees exactly its ancestors
    assert np.array_equal(tree_mask(tree.parents), reference)
    assert chain_positions(tree_mask(tree.parents), 11).tolist() == [10 + len(path) for path in nodes]
    assert tree.depths == tuple(len(path) for path in nodes)
    assert top_ranks(tree) == (3, 2, 1)
    top = [[100 * depth + rank for rank in range(3)] for depth in range(3)]  # head d's r-th best guess
    assert medusa_tree.head_tokens(tree, top) == [top[len(path) - 1][path[-1]] for path in nodes]
    candidates = leaf_paths(tree.parents)
    assert sorted(tuple(nodes[n] for n in c)[-1] for c in candidates) == [(0, 0, 0), (0, 1), (1, 0), (2,)]


def test_a_cached_tree_mask_is_read_only_host_data():
    """A tree of one shape recurs every pass and shares its cached mask: a write fails rather than
    change every later pass's mask, and the mask is the host's numpy array, moved to a device only
    by a pass's layout."""
    sees = tree_mask(build_tree(CHOICES).parents)
    assert isinstance(sees, np.ndarray) and sees.dtype == bool
    with pytest.raises(ValueError):
        sees[0, 1] = True
    assert tree_mask(build_tree(CHOICES).parents) is sees


def test_a_copied_chain_hangs_from_the_root_beside_the_heads_nodes():
    tree = build_tree(CHOICES, copy_depth=3)
    nodes = [*rank_paths(tree), ("copy",), ("copy",) * 2, ("copy",) * 3]  # the copied chain after the heads' nodes
    assert tree.sources == ("head",) * len(CHOICES) + ("copy",) * 3
    reference = np.array([[b == a[: len(b)] for b in nodes] for a in nodes])
    assert np.array_equal(tree_mask(tree.parents), reference)
    assert chain_positions(tree_mask(tree.parents), 11).tolist() == [10 + len(path) for path in nodes]
    assert tree.depths == tuple(len(path) for path in nodes)
    assert top_ranks(tree) == (3, 2, 1) and path_to(tree.parents, tree.size - 1) == [7, 8, 9]
    assert (7, 8, 9) in leaf_paths(tree.parents)  # its leaf is a candidate like the heads' leaves
    # every candidate, by brute force: the ancestry of each node that is no one's parent
    leaves = [n for n in range(len(nodes)) if not any(other[:-1] == nodes[n] for other in nodes)]
    ancestry = lambda n: tuple(m for m in range(len(nodes)) if nodes[n][: len(nodes[m])] == nodes[m])  # noqa: E731
    assert leaf_paths(tree.parents) == tuple(ancestry(n) for n in leaves)
    # filled, the copied chain takes its source, and the heads' nodes their tokens
    tokens = list(range(20, 20 + tree.size))
    proposal = medusa_tree.filled(tree, tokens, "retrieved")
    assert proposal.tokens == tuple(tokens) and proposal.parents == tree.parents
    assert proposal.sources == ("head",) * len(CHOICES) + ("retrieved",) * 3


def test_tree_presets_and_size(tiny_model, prompt_ids):
    heads = random_heads(tiny_model)
    heads.choices = [list(p) for p in CHOICES]
    run = lambda **kw: next(e for e in medusa.generate(  # noqa: E731
        tiny_model, prompt_ids, heads=heads, eos_token_ids=(), copy_length=0, **kw) if e.step == 1)
    static = run(tree="static").data
    assert static.tree_kind == "static" and static.tree.size == len(CHOICES)
    assert static.tree.depths == tuple(len(path) for path in sorted(CHOICES, key=lambda path: (len(path), path)))
    assert run(tree="chain").data.tree.depths == (1, 2, 3)
    assert run(tree="static", tree_size=3).data.tree.size == 3
    dynamic = run().data  # the default: as many nodes as the heads' static tree, chosen for this pass
    assert dynamic.tree_kind == "dynamic" and dynamic.tree.size == len(CHOICES)
    assert run(tree_size=12).data.tree.size == 12  # a dynamic tree may be larger than the static one
    assert run(tree="static", tree_size=60).data.tree.size == len(CHOICES)  # at most the whole tree
    with pytest.raises(SpecDemoError, match="tree_size"):
        run(tree="static", tree_size=999)
    with pytest.raises(SpecDemoError, match="tree_size"):
        run(tree_size=0)
    with pytest.raises(SpecDemoError, match="no parent"):
        run(tree=[(1, 1)])
    with pytest.raises(SpecDemoError, match="dynamic, static, chain"):
        run(tree="default")


def test_dynamic_paths_are_the_likeliest_paths_found_by_brute_force():
    """Every path of ranks over 3 heads of 5 candidates each, valued by the sum of its heads'
    log-probabilities: the dynamic tree of n nodes is exactly the n best, in order of value,
    and each of its prefixes is a tree."""
    import itertools

    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        # [K, R] best first
        log_probs = torch.log_softmax(torch.randn(3, 40, generator=generator) * 3, dim=-1).topk(5).values.tolist()
        value = lambda path, log_probs=log_probs: sum(log_probs[d][r] for d, r in enumerate(path))
        every = [path for depth in (1, 2, 3) for path in itertools.product(range(5), repeat=depth)]
        for size in (1, 4, 8, 17, 40):
            paths = dynamic_paths(log_probs, size)
            assert set(paths) == set(sorted(every, key=value, reverse=True)[:size])
            assert [value(path) for path in paths] == sorted((value(path) for path in paths), reverse=True)
            assert all(path[:-1] in paths[:i] for i, path in enumerate(paths) if len(path) > 1)


def test_a_dynamic_tree_goes_deep_where_the_heads_are_sure_and_wide_where_they_are_not():
    sure = [[-0.01, -5.0, -6.0], [-0.02, -5.0, -6.0], [-0.05, -4.0, -6.0]]
    assert dynamic_paths(sure, 3) == ((0,), (0, 0), (0, 0, 0))
    unsure = [[-0.9, -1.0, -1.2], [-2.0, -2.1, -2.2], [-2.5, -2.6, -3.0]]
    assert dynamic_paths(unsure, 3) == ((0,), (1,), (2,))


def test_verification_keeps_the_deepest_accepted_node():
    tree = build_tree(CHOICES)  # nodes: -1 root; 0 (0,) 1 (1,) 2 (2,); 3 (0,0) 4 (0,1) 5 (1,0); 6 (0,0,0)
    tokens = [11, 12, 13, 21, 22, 23, 31]
    # the target follows the root with 12 (node 1), then 23 (node 5): node 5, not the deeper node 6
    # whose parent (node 3) the target never reaches
    choices = [12, 21, 23, 0, 31, 0, 99, 0]  # after the root, then after each node
    proposal = medusa_tree.filled(tree, tokens)
    deepest_node = lambda choices: ([-1] + accept_greedy(proposal, choices)[0])[-1]  # noqa: E731
    assert deepest_node(choices) == 5
    assert deepest_node([0] * 8) == -1  # nothing accepted: the root
    choices[0] = 11  # now (0,) -> (0,0) -> (0,0,0) holds all the way down
    assert deepest_node(choices) == 6


def test_typical_acceptance_threshold_and_ties():
    """p(x) > min(ε, α exp(-H)): a sure target (low entropy) keeps the ε bar, an unsure one lowers it."""
    tree = build_tree([(0,), (1,)])  # two siblings under the root
    sure = torch.tensor([0.9, 0.05, 0.05, 0.0])  # H = 0.394: α e^-H = 0.202 > ε, so the bar is ε = 0.09
    probs = torch.stack([sure, sure, sure])
    token_probs = probs_after_parents(tree.parents, [0, 1], probs)
    verdicts, thresholds = typical_verdicts(tree.parents, token_probs, probs, epsilon=0.09, alpha=0.3)
    assert verdicts == [True, False] and thresholds[0] == pytest.approx(0.09)
    flat = torch.full((4,), 0.25)  # H = ln 4: the bar is α / 4 = 0.075, so both siblings (0.25) pass
    probs = torch.stack([flat, flat, flat])
    token_probs = probs_after_parents(tree.parents, [0, 1], probs)
    verdicts, thresholds = typical_verdicts(tree.parents, token_probs, probs, epsilon=0.09, alpha=0.3)
    assert verdicts == [True, True] and thresholds[0] == pytest.approx(0.075)
    assert deepest(medusa_tree.filled(tree, [0, 1]), verdicts, [0.2, 0.3]) == [1]  # same depth: the likelier (node 1)


def test_typical_acceptance_is_an_explicit_opt_in_for_sampling(tiny_model, prompt_ids):
    heads = random_heads(tiny_model)
    sampling = SamplingConfig(do_sample=True, temperature=0.8, seed=3)
    with pytest.raises(SpecDemoError, match="typical acceptance"):
        list(medusa.generate(tiny_model, prompt_ids, heads=heads, sampling=sampling))
    with pytest.raises(SpecDemoError, match="turn sampling on"):
        list(medusa.generate(tiny_model, prompt_ids, heads=heads, typical_acceptance=True))
    run = lambda: list(medusa.generate(tiny_model, prompt_ids, heads=heads, tree=CHOICES, sampling=sampling,  # noqa: E731
                                       typical_acceptance=True, max_new_tokens=30, eos_token_ids=()))
    events = run()
    assert events[-1].tokens == run()[-1].tokens  # seeded
    assert len(events[-1].tokens) == 30
    steps = [e for e in events[1:-1]]
    for event in steps:
        data = event.data
        for node in data.accepted_path:  # every accepted node cleared its parent's bar (row 0: after the root)
            parent = data.tree.parents[node]
            assert data.token_probs[node] > data.thresholds[parent + 1]
    assert any(event.accepted for event in steps)


def test_bad_trees_are_refused():
    with pytest.raises(SpecDemoError, match="no parent"):
        build_tree([(0, 0)])
    with pytest.raises(SpecDemoError, match="non-empty"):
        build_tree([])


def test_a_tree_pass_gives_the_logits_of_each_path_run_alone(tiny_model, prompt_ids):
    tree = build_tree(CHOICES)
    tokens = [int(t) for t in torch.randint(97, (tree.size,), generator=torch.Generator().manual_seed(1))]
    cache = DynamicCache(config=tiny_model.config)
    tiny_model(prompt_ids, past_key_values=cache, use_cache=True)  # the prompt's last token is the root
    length = prompt_ids.shape[1]
    fed, sees = torch.tensor([tokens]), tree_mask(tree.parents)
    tree_logits = tiny_model(
        fed, attention_mask=additive_mask(sees, length, torch.float32),
        position_ids=torch.from_numpy(chain_positions(sees, length))[None],
        past_key_values=cache, use_cache=True,
    ).logits[0]
    for path in leaf_paths(tree.parents):
        alone = tiny_model(
            torch.cat([prompt_ids, torch.tensor([[tokens[n] for n in path]])], dim=-1)).logits[0, length:]
        torch.testing.assert_close(tree_logits[list(path)], alone, atol=1e-5, rtol=1e-4)


def test_kv_compaction_keeps_exactly_the_accepted_path(tiny_model, prompt_ids):
    tree = build_tree(CHOICES)
    tokens = list(range(10, 10 + tree.size))
    length = prompt_ids.shape[1]
    cache = DynamicCache(config=tiny_model.config)
    tiny_model(prompt_ids, past_key_values=cache, use_cache=True)  # the prompt's last token is the root
    sees = tree_mask(tree.parents)
    tiny_model(
        torch.tensor([tokens]), attention_mask=additive_mask(sees, length, torch.float32),
        position_ids=torch.from_numpy(chain_positions(sees, length))[None], past_key_values=cache, use_cache=True,
    )
    path = max(leaf_paths(tree.parents), key=len)  # (0,), (0, 0), (0, 0, 0): not contiguous in fed order
    keep_positions(cache, length, [length + node for node in path])
    direct = DynamicCache(config=tiny_model.config)
    tiny_model(torch.cat([prompt_ids, torch.tensor([[tokens[n] for n in path]])], dim=-1), past_key_values=direct,
               use_cache=True)
    for kept, expected in zip(cache.layers, direct.layers):
        torch.testing.assert_close(kept.keys, expected.keys, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(kept.values, expected.values, atol=1e-5, rtol=1e-4)


def random_heads(model, num_heads=3, seed=0, vocab=None, reads_token=False):
    """Heads sharing `model`'s LM head, random blocks; with `reads_token`, reading the token each
    hidden state predicted too (as the embedded model's do; their mixers start as [I 0])."""
    torch.manual_seed(seed)
    heads = MedusaHeads(model.config.hidden_size, model.config.vocab_size, num_heads,
                        shared_lm_head=model.get_output_embeddings(), vocab=vocab,
                        embedding=model.get_input_embeddings() if reads_token else None)
    for block in heads.blocks:
        for layer in block:
            torch.nn.init.normal_(layer.linear.weight, std=0.2)
    return heads.eval()


@pytest.mark.parametrize("tree, tree_size",
                         [(CHOICES, None), ([(0,), (0, 0)], None), ("chain", None), ("dynamic", 3), ("dynamic", 12)])
def test_medusa_equals_ar_on_tiny_model(tiny_model, prompt_ids, tree, tree_size):
    expected = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=40, eos_token_ids=())).tokens
    events = list(
        medusa.generate(tiny_model, prompt_ids, heads=random_heads(tiny_model), tree=tree, tree_size=tree_size,
                        max_new_tokens=40, eos_token_ids=())
    )
    assert events[-1].tokens == expected
    for event in events[1:-1]:
        assert event.committed[: len(event.accepted)] == event.accepted
        tree = event.data.tree
        assert len(tree.tokens) == len(tree.parents) == len(tree.sources) == len(tree.depths)


def test_a_dynamic_tree_is_chosen_afresh_each_pass(tiny_model, prompt_ids):
    """Each pass's tree is the heads' likeliest paths at that step, so its shape changes with
    their confidences (heads with LM heads of their own, peaked enough to be sure at times)."""
    torch.manual_seed(0)
    heads = MedusaHeads(tiny_model.config.hidden_size, tiny_model.config.vocab_size, 3).eval()
    for lm_head in heads.lm_heads:
        torch.nn.init.normal_(lm_head.weight, std=0.5)
    events = list(medusa.generate(tiny_model, prompt_ids, heads=heads, tree_size=6, copy_length=0, max_new_tokens=30,
                                  eos_token_ids=()))[1:-1]
    assert len({e.data.tree.parents for e in events}) > 1
    for event in events:
        assert event.data.tree.size == 6 and event.data.tree_kind == "dynamic"


def test_the_copied_chain_commits_what_the_text_repeats(tiny_model, prompt_ids):
    """A tiny random model falls into loops: a copy of the text gets accepted where random heads
    are not, in fewer passes, and the answer is still AR's."""
    expected = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=60, eos_token_ids=())).tokens
    run = lambda copy_length: list(  # noqa: E731
        medusa.generate(tiny_model, prompt_ids, heads=random_heads(tiny_model), tree="chain", max_new_tokens=60,
                        copy_length=copy_length, eos_token_ids=())
    )
    alone, copying = run(0), run(6)
    assert alone[-1].tokens == copying[-1].tokens == expected
    assert copying[-1].target_forwards < alone[-1].target_forwards
    copied = [e for e in copying[1:-1]
              if any(e.data.tree.sources[node] == "copy" for node in e.data.accepted_path)]
    assert copied and max(e.data.accept_length for e in copied) >= 2
    with pytest.raises(SpecDemoError, match="copy_length"):
        run(-1)


def test_medusa_with_a_proposal_vocabulary_and_a_repetition_penalty_equals_ar(tiny_model, prompt_ids):
    """Heads that propose from 40 of the 97 tokens, and greedy decoding with a repetition
    penalty: each tree node is then scored after its own path, exactly as AR scores it."""
    sampling = SamplingConfig(repetition_penalty=1.3)
    expected = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=40, sampling=sampling,
                                         eos_token_ids=())).tokens
    heads = random_heads(tiny_model, vocab=torch.arange(0, 80, 2))
    summary = final_summary(medusa.generate(tiny_model, prompt_ids, heads=heads, tree=CHOICES, max_new_tokens=40,
                                            sampling=sampling, eos_token_ids=()))
    assert summary.tokens == expected
    assert {t for t in heads.top_tokens(torch.randn(tiny_model.config.hidden_size), (3, 2, 1))
            for t in t} <= set(range(0, 80, 2))


def test_heads_that_know_the_model_get_accepted():
    """A model that counts (t -> t+1) and heads whose LM head maps a hidden state to t + k + 2:
    every proposal is right, and the heads are sure of it, so the dynamic tree of 3 nodes is the
    chain of their best tokens and each pass commits its 3 tokens plus the target's."""
    from test_jacobi import make_bigram_model

    model = make_bigram_model({t: t + 1 for t in range(63)}, default=0)
    heads = MedusaHeads(model.config.hidden_size, model.config.vocab_size, 3)
    lm_head = model.get_output_embeddings().weight  # [V, H]
    for k, head in enumerate(heads.lm_heads):  # the row for token t+k+2 where the model's head has t+1
        head.weight.data = torch.roll(lm_head, shifts=k + 1, dims=0)
    events = [e for e in medusa.generate(model, torch.tensor([[3, 5]]), heads=heads, max_new_tokens=21,
                                         eos_token_ids=()) if isinstance(e, StepEvent)]
    assert [t for e in events for t in e.committed] == list(range(6, 27))
    assert [len(e.committed) for e in events] == [1, 4, 4, 4, 4, 4]


def test_heads_round_trip_in_both_formats(tiny_model, tmp_path):
    hidden = torch.randn(4, tiny_model.config.hidden_size)
    for vocab in (None, torch.tensor([1, 5, 9, 30])):
        heads = random_heads(tiny_model, vocab=vocab)
        heads.save(tmp_path / "ours", trained_on="nothing")
        loaded = load_heads(tmp_path / "ours", tiny_model)
        torch.testing.assert_close(loaded(hidden), heads(hidden))
        assert loaded.top_tokens(hidden[0], (2, 1, 1)) == heads.top_tokens(hidden[0], (2, 1, 1))
    # the published format: one Sequential(ResBlock..., Linear) per head, saved whole
    published = torch.nn.ModuleList(
        torch.nn.Sequential(*block, torch.nn.Linear(tiny_model.config.hidden_size, tiny_model.config.vocab_size,
                                                    bias=False)) for block in heads.blocks
    )
    (tmp_path / "published").mkdir()
    torch.save(published.state_dict(), tmp_path / "published" / "medusa_lm_head.pt")
    (tmp_path / "published" / "config.json").write_text(json.dumps({"medusa_num_heads": 3, "medusa_num_layers": 1}))
    loaded = load_heads(tmp_path / "published", tiny_model)
    expected = torch.stack([sequential(hidden) for sequential in published])
    torch.testing.assert_close(loaded(hidden), expected)
    with pytest.raises(SpecDemoError, match="no Medusa heads"):
        load_heads(tmp_path, tiny_model)


@pytest.mark.parametrize("tree", ["dynamic", "static", "chain"])
def test_medusa_with_trained_heads_equals_ar_on_embedded_model(embedded, tree):
    from specdemo.methods import method_options

    input_ids = embedded.encode_chat("Explain in two sentences why the sky is blue.")
    expected = final_summary(ar.generate(embedded.model, input_ids, max_new_tokens=48,
                                         eos_token_ids=embedded.eos_token_ids)).tokens
    heads = method_options("medusa", embedded)["heads"]
    summary = final_summary(medusa.generate(embedded.model, input_ids, heads=heads, tree=tree, max_new_tokens=48,
                                            eos_token_ids=embedded.eos_token_ids))
    assert summary.tokens == expected
    # the trained heads do get accepted (8-node trees)
    assert summary.tokens_per_forward > (1.0 if tree == "chain" else 1.1)


def token_heads(model, num_heads=3, seed=0, vocab=None):
    """Random heads that also read the token their hidden state predicted."""
    torch.manual_seed(seed)
    heads = MedusaHeads(model.config.hidden_size, model.config.vocab_size, num_heads,
                        shared_lm_head=model.get_output_embeddings(), vocab=vocab,
                        embedding=model.get_input_embeddings())
    # a tiny model's embeddings are small beside its hidden states
    scale = float(model.get_input_embeddings().weight.detach().std())
    for block, mixer in zip(heads.blocks, heads.mixers):
        torch.nn.init.normal_(mixer.linear.weight, std=0.2)
        mixer.linear.weight.data[:, model.config.hidden_size :] /= scale
        for layer in block:
            torch.nn.init.normal_(layer.linear.weight, std=0.2)
    return heads.eval()


def test_new_token_mixers_pass_the_hidden_state_through(tiny_model):
    """Heads that read the token start as the heads that do not (their mixers are [I 0]), so
    trained Medusa heads can be fine-tuned into them."""
    plain = random_heads(tiny_model)
    reading = MedusaHeads(tiny_model.config.hidden_size, tiny_model.config.vocab_size, 3,
                          shared_lm_head=tiny_model.get_output_embeddings(),
                          embedding=tiny_model.get_input_embeddings())
    reading.blocks.load_state_dict(plain.blocks.state_dict())
    hidden, tokens = torch.randn(5, tiny_model.config.hidden_size), torch.tensor([1, 2, 3, 4, 5])
    torch.testing.assert_close(reading(hidden, tokens), plain(hidden))
    with pytest.raises(SpecDemoError, match="pass it"):
        reading(hidden)


def test_heads_that_read_the_token_propose_after_it_and_equal_ar(tiny_model, prompt_ids):
    """The proposals change with the token alone, the heads round-trip with their mixers, and
    decoding with them, greedy, is still AR's answer."""
    heads = token_heads(tiny_model, vocab=torch.arange(0, 80, 2))
    hidden = torch.randn(tiny_model.config.hidden_size)
    assert len({str(heads.top_tokens(hidden, (3, 2, 1), token=token)) for token in range(20)}) > 1
    expected = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=40, eos_token_ids=())).tokens
    for tree in ("dynamic", CHOICES):
        summary = final_summary(medusa.generate(tiny_model, prompt_ids, heads=heads, tree=tree, max_new_tokens=40,
                                                eos_token_ids=()))
        assert summary.tokens == expected


def test_heads_that_read_the_token_round_trip(tiny_model, tmp_path):
    heads = token_heads(tiny_model, vocab=torch.tensor([1, 5, 9, 30]))
    heads.save(tmp_path / "ours", trained_on="nothing")
    loaded = load_heads(tmp_path / "ours", tiny_model)
    assert loaded.reads_token
    hidden, tokens = torch.randn(4, tiny_model.config.hidden_size), torch.tensor([3, 1, 4, 1])
    torch.testing.assert_close(loaded(hidden, tokens), heads(hidden, tokens))


def path_heads(model, num_heads=3, seed=0, vocab=None):
    """Random heads that read their tree path (Hydra)."""
    heads = token_heads(model, num_heads, seed, vocab)
    reading = MedusaHeads(model.config.hidden_size, model.config.vocab_size, num_heads,
                          shared_lm_head=model.get_output_embeddings(), vocab=vocab,
                          embedding=model.get_input_embeddings(), reads_path=True)
    reading.load_trained(heads.blocks.state_dict() | {f"mixers.{k}": v for k, v in heads.mixers.state_dict().items()})
    scale = float(model.get_input_embeddings().weight.detach().std())
    for mixer in reading.mixers:  # the path's columns random too (none for head 0), so the guesses depend on the path
        torch.nn.init.normal_(mixer.linear.weight.data[:, 2 * model.config.hidden_size :], std=0.2 / scale)
    return reading.eval()


def test_heads_that_read_their_path_start_as_the_heads_that_read_the_token(tiny_model, tmp_path):
    """A Hydra head started from a head that read the token alone keeps its columns and gets zero
    ones for the path, so it guesses as that head did whatever the path; saved and loaded, it
    reads the path again."""
    plain = token_heads(tiny_model)
    plain.save(tmp_path / "token")
    reading = MedusaHeads(tiny_model.config.hidden_size, tiny_model.config.vocab_size, 3,
                          shared_lm_head=tiny_model.get_output_embeddings(),
                          embedding=tiny_model.get_input_embeddings(), reads_path=True)
    from safetensors.torch import load_file

    reading.load_trained({k: v for k, v in load_file(tmp_path / "token" / medusa_heads.HEADS_FILE).items()
                          if k != medusa_heads.VOCAB_KEY})
    hidden, path = torch.randn(5, tiny_model.config.hidden_size), torch.randint(0, 97, (5, 3))
    torch.testing.assert_close(reading(hidden, path), plain(hidden, path[:, 0]))
    heads = path_heads(tiny_model, vocab=torch.tensor([1, 5, 9, 30, 44]))
    assert not torch.allclose(heads(hidden, path), heads(hidden, torch.cat([path[:, :1], path[:, 1:].flip(0)], dim=-1)))
    heads.save(tmp_path / "path")
    loaded = load_heads(tmp_path / "path", tiny_model)
    assert loaded.reads_path and loaded.reads_token
    torch.testing.assert_close(loaded(hidden, path), heads(hidden, path))
    with pytest.raises(SpecDemoError, match="embeddings"):
        MedusaHeads(8, 97, 3, reads_path=True)


@torch.no_grad()
def guesses_along(heads, hidden, root, path_tokens):
    """Head d's log-probabilities [S] after the path `path_tokens` (d of them), from the heads'
    teacher-forced forward: the reference for the tree's guesses."""
    tokens = torch.tensor([root, *path_tokens, *[0] * (heads.num_heads - 1 - len(path_tokens))])
    return torch.log_softmax(heads(hidden[None], tokens[None])[len(path_tokens), 0].float(), dim=-1)


def test_a_path_reading_tree_guesses_each_node_from_its_own_path(tiny_model):
    """Every node of the grown tree holds its head's r-th guess after its own path (r its rank
    among its siblings) and its value is the sum of its path's log-probabilities, both checked
    against the heads' teacher-forced forward; the static tree's tokens likewise."""
    heads = path_heads(tiny_model, vocab=torch.arange(0, 90, 3))
    index = {token: i for i, token in enumerate(heads.vocab.tolist())}
    hidden, root = 30 * torch.randn(tiny_model.config.hidden_size), 7  # large: peaked guesses, so the tree goes deep
    tree = medusa.grow(heads, hidden, root, depth=3, top_k=2, size=12)
    token_at = medusa.paths_of(tree)
    assert len(token_at) == 12 and max(map(len, token_at)) >= 2  # deeper nodes read their path
    assert sum(len(path) == 1 for path in token_at) > 2  # the root may have more children than top_k
    for node, path in enumerate(token_at):
        above = [token_at[path[:d]] for d in range(1, len(path))]
        log_probs = guesses_along(heads, hidden, root, above)
        ranked = heads.token_ids(log_probs.argsort(descending=True))
        assert ranked[path[-1]] == token_at[path] == tree.tokens[node]
        along = [token_at[path[: d + 1]] for d in range(len(path))]  # the path's tokens
        value = sum(float(guesses_along(heads, hidden, root, along[:d])[index[along[d]]]) for d in range(len(path)))
        assert tree.scores[node] == pytest.approx(value, abs=1e-4)
    static = medusa.path_tokens(heads, hidden, root, list(CHOICES))
    for path in CHOICES:
        above = [static[path[:d]] for d in range(1, len(path))]
        assert heads.token_ids(
            guesses_along(heads, hidden, root, above).argsort(descending=True))[path[-1]] == static[path]


@pytest.mark.parametrize("tree, tree_size, copy_length",
                         [("dynamic", 3, 0), ("dynamic", 12, None), (CHOICES, None, 0), ("chain", None, None)])
def test_heads_that_read_their_path_equal_ar(tiny_model, prompt_ids, tree, tree_size, copy_length):
    expected = final_summary(ar.generate(tiny_model, prompt_ids, max_new_tokens=40, eos_token_ids=())).tokens
    heads = path_heads(tiny_model, vocab=torch.arange(0, 80, 2))
    events = list(medusa.generate(tiny_model, prompt_ids, heads=heads, tree=tree, tree_size=tree_size,
                                  copy_length=copy_length, max_new_tokens=40,
                                  eos_token_ids=()))
    assert events[-1].tokens == expected
    for event in events[1:-1]:
        tree, path = event.data.tree, event.data.accepted_path
        assert len(tree.tokens) == len(tree.parents) == len(tree.sources) == len(tree.depths)
        assert all(tree.parents[child] == parent for parent, child in zip([-1, *path], path))  # from the root


def test_a_static_tree_gathered_on_the_device_holds_the_heads_tokens_of_its_ranks():
    """`on_device` read with the choices equals `filled` from the heads' best read on the host
    (`head_tokens`), with the index made once a request (`gather_index`) or made there."""
    shape = build_tree([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0]], copy_depth=2)
    ranked = torch.randperm(97)[:9].view(3, 3)  # [K, R]: each head's 3 best
    expected = medusa_tree.filled(shape, [*medusa_tree.head_tokens(shape, ranked.tolist()), 41, 42])
    for index in (medusa_tree.gather_index(shape, 3, ranked.device), None):
        read, _ = read_with_choices(medusa_tree.on_device(shape, ranked, [41, 42], "copy", index),
                                    torch.zeros(1 + shape.size, 97))
        assert (read.tokens, read.parents, read.sources) == (expected.tokens, expected.parents, expected.sources)
