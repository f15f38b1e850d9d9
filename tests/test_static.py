"""The compiled static path (`specdemo.core.static`): a static KV cache whose rollback moves a
length, passes padded to buckets, and every method's greedy answer unchanged through it
(float32, tiny random models; the embedded model's is `test_static_embedded`)."""

import logging
import random

import numpy as np
import pytest
import torch
from test_conformance import MAX_NEW_TOKENS, NAMES, configurations, eager_answers
from transformers import DynamicCache

from specdemo.core.attention import additive_mask, chain_positions, sees_from_parents
from specdemo.core.events import final_summary
from specdemo.core.graphs import layout_views, padded_inputs
from specdemo.core.kvcache import StaticKV, keep_positions, keep_prefix
from specdemo.core.static import (
    CompiledPass,
    compile_passes,
    fitted_copy,
    fitted_size,
    padded_layout,
    request_cache,
    static_forward,
    unpadded_layout,
)
from specdemo.core.transfer import tensor_on
from specdemo.core.verify import Proposal, target_pass
from specdemo.methods import ar, medusa, speculative

from conftest import make_tiny_model

TREE = [-1, 0, 0, 1, -1, 4]  # two roots' children, branching: a forest as the engine feeds it


def laid_out(positions: np.ndarray, sees: np.ndarray, start: int):
    """The layout of an unpadded pass writing at `start`, on the CPU."""
    return unpadded_layout(positions, sees, start, torch.device("cpu"))


def prompt_layout(n: int):
    return laid_out(np.arange(n), np.tri(n, dtype=bool), 0)


def test_static_forward_equals_transformers_pass_and_never_reads_past_the_valid_length(tiny_model, prompt_ids):
    """Eager, no compiler: the static pass over a tree equals transformers' pass over a
    DynamicCache with the same 4-D mask, however much stale data lies past the valid length."""
    decoder = tiny_model.get_decoder()
    sees = sees_from_parents(TREE)
    tokens = torch.tensor([[7, 11, 13, 17, 19, 23]])
    with torch.inference_mode():
        dynamic = DynamicCache(config=tiny_model.config)
        decoder(input_ids=prompt_ids, past_key_values=dynamic, use_cache=True)
        out = decoder(input_ids=tokens, past_key_values=dynamic, use_cache=True,
                      attention_mask=additive_mask(sees, prompt_ids.shape[1], torch.float32),
                      position_ids=torch.from_numpy(chain_positions(sees, prompt_ids.shape[1]))[None],
                      output_hidden_states=True)
        expected = out.last_hidden_state
        static = StaticKV(tiny_model, 64)
        for layer in static.layers:  # garbage everywhere: only what a pass writes may be read
            layer.keys.normal_(), layer.values.normal_()
        n = prompt_ids.shape[1]
        static_forward(decoder, static, prompt_ids, prompt_layout(n))
        static.length = n
        static.start.fill_(n)
        got = static_forward(decoder, static, tokens, laid_out(chain_positions(sees, n), sees, n))
        # the same pass again, also returning the residual stream after layer 1 (a feature draft's `layers`)
        static.length = n
        static.start.fill_(n)
        joined, logits = static_forward(decoder, static, tokens, laid_out(chain_positions(sees, n), sees, n),
                                        tiny_model.get_output_embeddings(), layers=(1,))
        expected_logits = tiny_model.get_output_embeddings()(expected)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(joined, torch.cat([out.hidden_states[1], expected], dim=-1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, expected_logits, rtol=1e-5, atol=1e-5)


def test_a_window_of_the_buffer_gives_the_same_pass_and_writes_into_the_buffer(tiny_model, prompt_ids):
    """A pass through `StaticKV.window` (the buffers' first positions, as views) equals the pass
    over the whole buffer, and what it writes lands in the buffer itself."""
    decoder = tiny_model.get_decoder()
    n, sees = prompt_ids.shape[1], sees_from_parents(TREE)
    tokens = torch.tensor([[7, 11, 13, 17, 19, 23]])
    caches = [StaticKV(tiny_model, 64) for _ in range(2)]
    outputs = []
    with torch.inference_mode():
        for cache, window in zip(caches, (None, n + tokens.shape[1])):
            for layer in cache.layers:  # stale data past the valid length, different in each buffer
                layer.keys.normal_(), layer.values.normal_()
            static_forward(decoder, cache, prompt_ids, prompt_layout(n))
            cache.length = n
            cache.start.fill_(n)
            seen = cache if window is None else cache.window(window)
            assert seen.get_seq_length() == n and (window is None or seen.layers[0].keys.shape[2] == window)
            outputs.append(static_forward(decoder, seen, tokens, laid_out(chain_positions(sees, n), sees, n)))
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)
    end = n + tokens.shape[1]
    for whole, windowed in zip(caches[0].layers, caches[1].layers):
        torch.testing.assert_close(windowed.keys[:, :, :end], whole.keys[:, :, :end])
    assert caches[1].window(64) is caches[1] and caches[1].window(end) is seen  # the whole buffer; a window built once


def test_padding_masks_the_padded_nodes_out():
    sees = sees_from_parents(TREE)
    tokens, positions = torch.tensor([[7, 11, 13, 17, 19, 23]]), chain_positions(sees, 10)
    fed, view = padded_inputs(tokens, 8), layout_views(padded_layout(positions, sees, 8, start=10), 8)
    at, seen = view.positions, view.sees[:, 1:-1].bool()  # bytes, 1 where a node sees
    assert fed.shape == at.shape == (1, 8) and seen.shape == (8, 8)
    assert view.slots.tolist() == list(range(10, 18)) and int(view.start) == 10 and int(view.first) == 9
    assert view.sees[:, 0].all() and not view.sees[:, -1].any()  # the cache before the pass; what lies past it
    assert fed[0, :6].tolist() == tokens[0].tolist() and at[0, :6].tolist() == positions.tolist()
    assert np.array_equal(seen[:6, :6], sees)
    assert not seen[:6, 6:].any() and not seen[6:, :6].any()  # no real node sees a padded one, nor the reverse
    assert torch.equal(seen[6:, 6:], torch.eye(2, dtype=torch.bool))
    assert fed.is_contiguous() and fed.stride() == (8, 1)  # fresh tensors: a graph is specialised on strides


def test_a_look_back_padded_to_its_window_gives_the_unpadded_pass(tiny_model, prompt_ids):
    """A draft tree's third level looks back at the nodes fed before it: padded to 8 nodes and a
    window of 8 cached positions (as a CUDA graph of that kind runs it), its real nodes' hidden
    states and the keys they write equal the unpadded pass's, over stale data past the valid length."""
    decoder, n = tiny_model.get_decoder(), prompt_ids.shape[1]
    level = torch.tensor([[7, 11, 13]])  # the second level's nodes, fed first
    sees = np.array([[True, False, False, True, False],  # the third level: each sees one earlier node and itself
                     [False, False, True, False, True]])
    tokens, positions = torch.tensor([[17, 19]]), np.full(2, n + 1)
    outputs, caches = [], [StaticKV(tiny_model, 64) for _ in range(2)]
    with torch.inference_mode():
        for cache, padded in zip(caches, (False, True)):
            for layer in cache.layers:
                layer.keys.normal_(), layer.values.normal_()
            static_forward(decoder, cache, prompt_ids, prompt_layout(n))
            cache.length = n
            cache.start.fill_(n)
            static_forward(decoder, cache, level, laid_out(np.full(3, n), np.eye(3, dtype=bool), n))
            cache.length = n + 3
            cache.start.fill_(n + 3)
            if padded:
                view = layout_views(padded_layout(positions, sees, 8, look_back=8, start=n + 3), 8)
                seen = view.sees[:, 1:-1].bool()
                assert seen.shape == (8, 16) and seen[:, :5].all() and np.array_equal(seen[:2, 5:10], sees)
                outputs.append(static_forward(decoder, cache, padded_inputs(tokens, 8), view)[:, :2])
            else:
                outputs.append(static_forward(decoder, cache, tokens, laid_out(positions, sees, n + 3)))
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-5)
    for unpadded, padded in zip(caches[0].layers, caches[1].layers):
        torch.testing.assert_close(padded.keys[:, :, : n + 5], unpadded.keys[:, :, : n + 5])


@pytest.mark.parametrize("per_layer", [False, True], ids=["one buffer", "a buffer a layer"])
def test_static_rollback_moves_the_length_and_gathers_the_accepted_path(tiny_model, per_layer):
    cache = StaticKV(tiny_model, 32, per_layer=per_layer)
    assert (cache.buffer is None) == per_layer
    for index, layer in enumerate(cache.layers):
        layer.keys.copy_(torch.arange(32, dtype=torch.float32)[None, None, :, None].expand_as(layer.keys))
        layer.values.copy_(100 * index + torch.arange(32, dtype=torch.float32)[None, None, :, None])
    cache.length = 12
    keep_positions(cache, 5, [7, 9])  # keep 5, then the entries at 7 and 9 moved to 5 and 6
    assert cache.get_seq_length() == 7
    for index, layer in enumerate(cache.layers):
        assert layer.keys[0, 0, :7, 0].tolist() == [0, 1, 2, 3, 4, 7, 9]
        assert layer.values[0, -1, :7, -1].tolist() == [100 * index + p for p in (0, 1, 2, 3, 4, 7, 9)]
    keep_prefix(cache, 3)
    assert cache.get_seq_length() == 3
    with pytest.raises(ValueError):
        keep_prefix(cache, 4)


def test_rollback_indexes_each_layer_on_the_device_it_is_on(monkeypatch):
    """A model spread over devices (accelerate's device map) has its cache spread the same way: each
    layer gathers its accepted path with an index on its own device, made once for each device."""
    from specdemo.core import kvcache

    made = []
    monkeypatch.setattr(kvcache, "tensor_on", lambda data, device: made.append(torch.device(device))
                        or tensor_on(data, device))
    cache = DynamicCache()
    for index, device in enumerate(["cpu", "cpu", "meta"]):
        entries = torch.arange(8, dtype=torch.float32, device=device)[None, None, :, None] + 100 * index
        cache.update(entries, entries.clone(), index)
    keep_positions(cache, 3, [5, 7])
    assert made == [torch.device("cpu"), torch.device("meta")] and cache.get_seq_length() == 5
    assert [layer.keys.device.type for layer in cache.layers] == ["cpu", "cpu", "meta"]
    assert cache.layers[1].values[0, 0, :, 0].tolist() == [100, 101, 102, 105, 107]


def test_a_request_without_a_compiled_pass_keeps_transformers_cache(prompt_ids):
    model = make_tiny_model()
    assert isinstance(request_cache(model, 40), DynamicCache)
    assert not hasattr(model, "passes") and not hasattr(model, "compiled_pass")  # nothing is set on a model


@pytest.fixture(scope="module")
def compiled_models():
    """Fresh tiny models (not the session's), compiled for two buckets: passes wider than 8
    (a long tree, lookahead's window) run the same static function eagerly."""
    target, other = make_tiny_model(), make_tiny_model(seed=1)
    configs = configurations(target, other)
    expected = eager_answers(configs)  # eager, on the reference's weights
    passes = {id(model): compile_passes(model, buckets=(1, 8)) for model in (target, configs["cllm, jacobi"][2])}
    assert not hasattr(target, "compiled_pass")  # the compiled pass is a value: nothing is set on the model
    return target, configs, expected, passes


@pytest.mark.parametrize("name", [name for name in NAMES if name not in ("beam", "contrastive")])
def test_every_method_gives_ars_answer_through_the_compiled_pass(compiled_models, prompt_ids, name):
    target, configs, expected, compiled = compiled_models
    generate, options, reference = configs[name]
    model = reference  # CLLM decodes its own (compiled) weights
    passes = compiled[id(model)]
    assert isinstance(request_cache(model, 40, passes), StaticKV)
    before = sum(passes.runs.values())
    # then the draft's passes take the same graphs
    drafted_by_target = getattr(options.get("draft"), "model", None) is target
    given = {"passes": passes, **({"cllm_passes": passes} if name.startswith("cllm") else {}),
             **({"draft_passes": passes} if drafted_by_target else {})}
    summary = final_summary(generate(model if name.startswith("cllm") else target, prompt_ids,
                                     max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=(), **options, **given))
    assert summary.tokens == expected[name]
    assert (sum(passes.runs.values()) - before > summary.target_forwards) if drafted_by_target else \
        (sum(passes.runs.values()) - before == summary.target_forwards)  # every target pass took the static path
    assert not passes.failed


def test_a_compiled_target_pass_gives_the_heads_logits_in_float32(compiled_models, prompt_ids):
    """The LM head runs inside the target's graph: a tree's logits [rows, V] are float32 and
    equal the eager pass's over the same tree, and the compiled graph ran (not the eager fallback)."""
    target, _, _, compiled = compiled_models
    proposal = Proposal((7, 11, 13, 17), (-1, 0, 0, 1), ("draft",) * 4)
    passes = compiled[id(target)]
    with torch.inference_mode():
        results, ran = [], []
        for cache in (request_cache(target, 40, passes), DynamicCache(config=target.config)):
            target_pass(target, cache, prompt_ids[:, :-1], Proposal())  # the prompt but its last token
            before = passes.runs[8]
            results.append(target_pass(target, cache, prompt_ids, proposal, features=True))
            ran.append(passes.runs[8] - before)
        compiled, eager = results
    assert ran == [1, 0]  # 1 pending + 4 nodes in the 8 bucket, through the graph; the eager pass not
    assert compiled.logits.dtype == eager.logits.dtype == torch.float32 \
        and compiled.logits.shape == (5, target.config.vocab_size)
    torch.testing.assert_close(compiled.logits, eager.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(compiled.hidden, eager.hidden, rtol=1e-4, atol=1e-4)
    # a prompt wider than every bucket runs the same function eagerly, its head over the rows asked for alone
    long_prompt = torch.arange(1, 41)[None]
    with torch.inference_mode():
        before = passes.runs[0]
        wide, reference = (target_pass(target, cache, long_prompt, Proposal())
                           for cache in (request_cache(target, 60, passes), DynamicCache(config=target.config)))
    assert passes.runs[0] == before + 1 and wide.logits.shape == (1, target.config.vocab_size) \
        and wide.logits.dtype == torch.float32
    torch.testing.assert_close(wide.logits, reference.logits, rtol=1e-4, atol=1e-4)


def test_compiled_passes_are_padded_to_their_buckets(compiled_models, prompt_ids):
    target, configs, _, compiled = compiled_models
    passes = compiled[id(target)]
    passes.runs.clear()
    final_summary(ar.generate(target, prompt_ids, max_new_tokens=10, eos_token_ids=(), passes=passes))
    assert dict(passes.runs) == {8: 1, 1: 9}  # the 6-token prompt in the 8 bucket, then one token a pass
    passes.runs.clear()
    long_prompt = torch.arange(1, 41)[None]  # wider than every bucket: eager, on the same static cache
    final_summary(ar.generate(target, long_prompt, max_new_tokens=3, eos_token_ids=(), passes=passes))
    assert dict(passes.runs) == {0: 1, 1: 2}


def test_passes_up_to_the_end_of_a_request_reuse_the_graphs_compiled_at_load(compiled_models, prompt_ids):
    """Every pass attends over a window of the buffers (views), up to the request's last: a pass
    over the whole buffer instead recompiled the graph (a minute on a CPU, inside an answer)."""
    target, _, expected, compiled = compiled_models
    graphs = lambda: len(torch._dynamo.eval_frame._debug_get_cache_entry_list(static_forward.__code__))  # noqa: E731
    before = graphs()
    for max_new_tokens in (MAX_NEW_TOKENS, 230 - prompt_ids.shape[1]):  # the second runs to a 256-position window
        summary = final_summary(ar.generate(target, prompt_ids, max_new_tokens=max_new_tokens, eos_token_ids=(),
                                            passes=compiled[id(target)]))
        assert summary.tokens[:MAX_NEW_TOKENS] == expected["ar"]
    assert graphs() == before


def test_a_tree_fills_its_bucket_narrow_on_a_cpu_and_whole_with_cuda():
    bucket = CompiledPass(None, (1, 8, 16, 32, 64), None).bucket
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert fitted_size(12, 0, None, cpu) == 12 and fitted_size(12, 5, None, cuda) == 12  # eager: what was asked
    # a CPU pass costs about its width: the narrowest bucket holding the root, the copy and half the tree, filled
    assert fitted_size(12, 0, bucket, cpu) == 7  # 12 nodes run as 8, not 16
    # the copy takes the least likely nodes' room
    assert fitted_size(6, 0, bucket, cpu) == 7 and fitted_size(6, 3, bucket, cpu) == 4
    assert fitted_size(6, 8, bucket, cpu) == 7  # a copy that needs 16 leaves room for more nodes than asked, at no cost
    assert fitted_size(12, 15, bucket, cpu) == 16  # a copy that takes 32 anyway: the tree fills it
    # half the tree, unless that takes a pass 32 wide
    assert fitted_size(7, 12, bucket, cpu) == 3 and fitted_size(7, 11, bucket, cpu) == 4
    # with CUDA graphs a pass costs about the same at any width: the bucket holding everything, filled
    assert fitted_size(12, 0, bucket, cuda) == 15 and fitted_size(12, 8, bucket, cuda) == 23 \
        and fitted_size(6, 0, bucket, cuda) == 7
    # a tree too large for the widest bucket fills it rather than run eagerly, down to half its size
    assert fitted_size(60, 8, bucket, cuda) == 55 and fitted_size(63, 0, bucket, cuda) == 63
    assert fitted_size(40, 40, bucket, cuda) == 23 and fitted_size(40, 50, bucket, cuda) == 40  # half: eager, as asked


def test_a_static_tree_takes_the_copy_that_fits_its_widest_bucket():
    """A static tree's nodes are fixed: its copied branch is cut so that the pass fits a bucket."""
    bucket = CompiledPass(None, (1, 8, 16, 32, 64), None).bucket
    assert fitted_copy(56, 8, None) == 8  # eager: all of it
    assert fitted_copy(56, 8, bucket) == 7 and fitted_copy(55, 8, bucket) == 8 and fitted_copy(63, 8, bucket) == 0
    assert fitted_copy(5, 3, bucket) == 3 and fitted_copy(56, 0, bucket) == 0


def test_compiled_medusa_fills_each_padded_pass_with_tree_nodes(compiled_models, prompt_ids):
    target, configs, expected, compiled = compiled_models
    options = {**configs["medusa, dynamic tree"][1], "tree_size": 5, "copy_length": 0, "passes": compiled[id(target)]}
    events = list(medusa.generate(target, prompt_ids, max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=(), **options))
    summary, steps = events[-1], events[1:-1]  # after the prefill's pass, every pass holds a tree
    assert summary.tokens == expected["ar"]
    assert steps and all(len(step.proposed) == 7 for step in steps)  # the root and 5 nodes run as 8: 7 nodes fill it


def test_a_compiled_draft_tree_fills_each_padded_pass(compiled_models, prompt_ids):
    """The default 6 nodes at depth 2 run as 8 on a CPU: 7 slots, which 2 children per node
    cannot fill (2 + 4), so the tree grows 3 (`draft_tree.children_to_fill`) and holds 7."""
    target, configs, expected, compiled = compiled_models
    options = {**configs["speculative, feature draft, tree"][1], "gamma": 2, "draft_tree_size": 6,
               "draft_tree_top_k": 2, "copy_length": 0,
               "passes": compiled[id(target)]}
    events = list(speculative.generate(target, prompt_ids, max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=(), **options))
    summary, steps = events[-1], [event for event in events[1:-1] if event.proposed]  # the first pass drafts nothing
    assert summary.tokens == expected["ar"]
    assert steps and all(len(step.proposed) == 7 for step in steps[:-2])  # room allowing (the last steps may hold less)


@pytest.fixture(scope="module")
def compiled_drafts() -> dict:
    """The compiled passes of the tiny configurations' drafts, by the id of the draft's model."""
    return {}


def compiled_draft(compiled_drafts: dict, draft):
    """The compiled pass of `draft` (one width, 4: a chain's one token and a tree level's nodes padded
    to it; each width compiles for half a minute here), made once a module: tests share its graphs."""
    if id(draft.model) not in compiled_drafts:
        compiled_drafts[id(draft.model)] = compile_passes(draft.model, buckets=(4,), role="draft")
    return compiled_drafts[id(draft.model)]


@pytest.mark.parametrize("name", ["speculative, token draft, chain", "speculative, token draft, tree",
                                  "speculative, feature draft, chain", "speculative, feature draft, tree"])
def test_a_compiled_draft_proposes_what_the_eager_draft_proposes(compiled_models, compiled_drafts, prompt_ids, name):
    """The drafts' passes on the static path (point 5): the same proposals, pass for pass. gamma = 3
    trees feed a third level that looks back at the second's branches: the window of `sees`."""
    target, configs, expected, compiled = compiled_models
    generate, options, _ = configs[name]
    passes = compiled_draft(compiled_drafts, options["draft"])  # a chain and a tree share their draft's graphs
    passes.runs.clear()
    runs = [list(generate(target, prompt_ids, max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=(), **options,
                          passes=compiled[id(target)], draft_passes=draft_passes))
            for draft_passes in (None, passes)]
    assert [event.proposed for event in runs[1][:-1]] == [event.proposed for event in runs[0][:-1]]
    assert runs[1][-1].tokens == expected[name]
    # the prompt eagerly, steps compiled
    assert passes.runs[0] and passes.runs[4] > len(runs[1]) // 2
    assert not passes.failed


def test_without_the_targets_pass_the_target_and_its_draft_run_eagerly(compiled_models, compiled_drafts, prompt_ids):
    """An eager twin (the bench's `speculative_eager`) beside compiled models: no compiled pass runs,
    the draft's neither (it runs only beside the target's), and the answer is the same."""
    target, configs, expected, compiled = compiled_models
    generate, options, _ = configs["speculative, feature draft, tree"]
    draft_passes = compiled_draft(compiled_drafts, options["draft"])
    for passes in (compiled[id(target)], draft_passes):
        passes.runs.clear()
    summary = final_summary(generate(target, prompt_ids, max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=(), **options,
                                     passes=None, draft_passes=draft_passes))
    assert summary.tokens == expected["speculative, feature draft, tree"]
    assert not compiled[id(target)].runs and not draft_passes.runs


def test_a_compiler_failure_warns_once_and_runs_eagerly(prompt_ids, caplog):
    model = make_tiny_model()
    expected = final_summary(ar.generate(model, prompt_ids, max_new_tokens=12, eos_token_ids=())).tokens
    passes = compile_passes(model, buckets=(1,))

    def broken(*args):
        raise RuntimeError("no C++ compiler")

    passes.forward = broken
    with caplog.at_level(logging.WARNING, logger="specdemo.core.static"):
        tokens = final_summary(ar.generate(model, prompt_ids, max_new_tokens=12, eos_token_ids=(),
                                           passes=passes)).tokens
    assert tokens == expected
    assert passes.failed and "no C++ compiler" in passes.failed
    assert len([r for r in caplog.records if "eagerly" in r.message]) == 1
    assert isinstance(request_cache(model, 40, passes), DynamicCache)  # the next request is eager from the start


def test_sees_from_parents_is_the_brute_force_ancestry():
    """Token i sees token j exactly when j is i or one of its ancestors; a parent must come first."""
    rng = random.Random(0)
    for n in (0, 1, 5, 17, 64):
        parents = [rng.randrange(-1, i) for i in range(n)]
        expected = np.zeros((n, n), dtype=bool)
        for i in range(n):
            j = i
            while j >= 0:
                expected[i, j], j = True, parents[j]
        assert np.array_equal(sees_from_parents(parents), expected)
    with pytest.raises(ValueError):
        sees_from_parents([-1, 1])


def test_a_tensor_made_on_the_host_for_a_cpu_stays_a_plain_tensor():
    made = tensor_on([[3, 1, 2]], torch.device("cpu"))
    assert made.tolist() == [[3, 1, 2]] and made.dtype == torch.long and not made.is_pinned()
