"""The CUDA path is the CPU path's code: on a GPU, every method's greedy output equals AR's there,
eager and through the CUDA graphs (`specdemo.core.graphs`), and sampling runs. Skipped without CUDA
(CI has none); run on a GPU machine with `python -m pytest tests/test_cuda.py`."""

import pytest
import torch
from test_grouped_attention import Attention, inputs, tree_mask
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specdemo.core import grouped_attention
from specdemo.core.events import final_summary
from specdemo.core.graphs import FunctionGraphs
from specdemo.core.sampling import SamplingConfig
from specdemo.core.transfer import tensor_on
from specdemo.methods import ar, jacobi, lookahead, medusa, speculative
from specdemo.methods.draft import Draft

from conftest import make_tiny_model
from test_eagle import feature_draft
from test_medusa import CHOICES, random_heads
from test_static_draft_tree import IRREGULAR as STATIC_PATHS

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

RUNS = {
    "speculative chain, token draft": lambda m, o: (speculative,
                                                    dict(draft=Draft("other", o), gamma=3, draft_tree_size=0)),
    "speculative tree, feature draft, copy": lambda m, o: (speculative,
                                                           dict(draft=feature_draft(m), gamma=3, draft_tree_size=8)),
    "speculative static tree, feature draft, copy": lambda m, o: (speculative, dict(draft=feature_draft(m), gamma=4,
                                                                                  static_tree=STATIC_PATHS)),
    # EAGLE-3's tree, a candidate of the GPU's sweep (`scripts/gpu_sweep.py`): 7 deep, top-k 10, 60 nodes
    "speculative deep tree, feature draft": lambda m, o: (speculative, dict(draft=feature_draft(m), gamma=7,
                                                                            draft_tree_size=60, draft_tree_top_k=10)),
    "medusa tree, copy": lambda m, o: (medusa, dict(heads=random_heads(m).to(m.device), tree=CHOICES)),
    "medusa dynamic tree of 63, the sweep's widest": lambda m, o: (medusa, dict(heads=random_heads(m).to(m.device),
                                                                                 tree_size=63)),
    # as the embedded model's heads: reading the token, proposing from a vocabulary of their own
    "medusa dynamic tree, graphed heads reading the token": lambda m, o: (
        medusa, dict(heads=random_heads(m, reads_token=True, vocab=torch.arange(0, m.config.vocab_size, 2))
                     .to(m.device), tree_size=12, heads_passes=FunctionGraphs())),
    "lookahead": lambda m, o: (lookahead, dict()),
    "lookahead, the sweep's widest pass": lambda m, o: (lookahead, dict(window=7, ngram=4, candidates=10)),
    "jacobi": lambda m, o: (jacobi, dict(block_size=8)),
}


@pytest.fixture(scope="module")
def models():
    return make_tiny_model().cuda(), make_tiny_model(seed=1).cuda()


@pytest.fixture
def cuda_prompt(prompt_ids):
    return prompt_ids.cuda()


@pytest.mark.parametrize("run", list(RUNS))
def test_greedy_equals_ar_on_cuda(models, cuda_prompt, run):
    model, other = models
    method, options = RUNS[run](model, other)
    expected = final_summary(ar.generate(model, cuda_prompt, max_new_tokens=48, eos_token_ids=())).tokens
    summary = final_summary(method.generate(model, cuda_prompt, max_new_tokens=48, eos_token_ids=(), **options))
    assert summary.tokens == expected
    assert summary.target_forwards <= 48


def test_each_step_times_its_target_pass_without_a_wait_of_its_own(models, cuda_prompt):
    """A pass's time comes from two CUDA events read once the step waited for its choices
    (`loop.PassClock`): every step has one, and no step's exceeds the run's."""
    model, _ = models
    events = list(ar.generate(model, cuda_prompt, max_new_tokens=16, eos_token_ids=()))
    summary = final_summary(events)
    steps = [event.target_s for event in events[:-1]]
    assert len(steps) == 16 and all(0 < seconds <= summary.elapsed_s for seconds in steps)
    assert summary.target_s == pytest.approx(sum(steps))


def test_sampling_runs_on_cuda(models, cuda_prompt):
    model, other = models
    sampling = SamplingConfig(do_sample=True, temperature=0.8, top_k=20, top_p=0.9, seed=3)
    for method, options in ((ar, {}), (speculative, dict(draft=Draft("other", other), gamma=3, draft_tree_size=0))):
        tokens = final_summary(method.generate(model, cuda_prompt, max_new_tokens=32, sampling=sampling,
                                               eos_token_ids=(), **options)).tokens
        assert len(tokens) == 32 and all(0 <= t < model.config.vocab_size for t in tokens)


@pytest.fixture(scope="module")
def compiled_models():
    """Fresh tiny models on the GPU with the compiled pass: hand-captured CUDA graphs, one a bucket."""
    from specdemo.core.grouped_attention import use_grouped_attention
    from specdemo.core.static import compile_passes

    model, other = make_tiny_model().cuda(), make_tiny_model(seed=1).cuda()
    assert use_grouped_attention(model) == 1  # as `models.load_model` does: a graph's wide passes take its path
    passes = compile_passes(model, buckets=(1, 8, 16, 32))
    assert passes.mode == "cuda-graphs" and not passes.failed
    assert sorted(key[0] for key in passes.graphs.graphs) == [1, 8, 16, 32]
    return model, other, passes


@pytest.mark.parametrize("run", list(RUNS))
def test_greedy_equals_ar_through_the_compiled_pass_on_cuda(compiled_models, cuda_prompt, run):
    model, other, passes = compiled_models
    method, options = RUNS[run](model, other)
    # compiled AR
    expected = final_summary(ar.generate(model, cuda_prompt, max_new_tokens=48, eos_token_ids=(), passes=passes)).tokens
    # eager AR
    assert final_summary(ar.generate(model, cuda_prompt, max_new_tokens=48, eos_token_ids=())).tokens == expected
    before = sum(passes.runs.values())
    replayed = sum(passes.runs[width] for width in passes.buckets)
    summary = final_summary(method.generate(model, cuda_prompt, max_new_tokens=48, eos_token_ids=(), passes=passes,
                                            **options))
    assert summary.tokens == expected
    assert sum(passes.runs.values()) - before == summary.target_forwards and not passes.failed
    assert "heads_passes" not in options or (options["heads_passes"].graphs  # the heads' graphs were captured
                                             and not options["heads_passes"].failed)
    # all but the prompt's pass replayed a graph
    assert sum(passes.runs[width] for width in passes.buckets) - replayed >= summary.target_forwards - 1


def test_a_deep_draft_tree_replays_the_drafts_graphs_on_cuda(compiled_models, cuda_prompt):
    """A token draft's tree 4 deep looks back at its earlier branches from its third level on:
    with CUDA, those draft passes replay graphs of their look-back window, and the answer is still
    AR's. A feature draft's tree grows on the device in one graph, and its answer is AR's too."""
    from specdemo.core.static import DRAFT_BUCKETS, compile_passes

    model, other, passes = compiled_models
    expected = final_summary(ar.generate(model, cuda_prompt, max_new_tokens=48, eos_token_ids=(), passes=passes)).tokens
    for draft in (Draft("other", other), feature_draft(model)):
        draft_passes = compile_passes(draft.model, DRAFT_BUCKETS, role="draft")
        summary = final_summary(speculative.generate(model, cuda_prompt, max_new_tokens=48, eos_token_ids=(),
                                                     passes=passes, draft=draft, gamma=4, draft_tree_size=24,
                                                     draft_passes=draft_passes))
        assert summary.tokens == expected
        assert draft_passes.runs[0] <= 1 and not draft_passes.failed  # eager: at most the prompt's pass
        if isinstance(draft, Draft):  # a look-back graph was captured and replayed: columns past the width and frame
            assert any(key[1] > key[0] + 2 for key in draft_passes.graphs.graphs)
        else:  # one graph, the shallower steps near the answer's end replaying it too
            assert [kind[0][0] for kind in draft_passes.graphs.functions.graphs] == ["dynamic draft tree"]


def test_a_static_draft_tree_replays_one_graph_for_its_levels_on_cuda(compiled_models, cuda_prompt):
    """A feature draft's static tree over its graphs' buffer drafts its levels in one CUDA graph
    (`static_draft_tree.graphed_levels`), and the answer is still AR's, as with the draft eager
    (`tests/test_graphs.py` checks the trees node for node on a CPU)."""
    from specdemo.core.static import DRAFT_BUCKETS, compile_passes

    model, _, passes = compiled_models
    draft = feature_draft(model)
    draft_passes = compile_passes(draft.model, DRAFT_BUCKETS, role="draft")
    expected = final_summary(ar.generate(model, cuda_prompt, max_new_tokens=48, eos_token_ids=(), passes=passes)).tokens
    runs = [list(speculative.generate(model, cuda_prompt, max_new_tokens=48, eos_token_ids=(), passes=passes,
                                      draft=draft, gamma=4, static_tree=STATIC_PATHS, draft_passes=given))
            for given in (None, draft_passes)]
    assert final_summary(runs[1]).tokens == final_summary(runs[0]).tokens == expected
    assert len(draft_passes.graphs.functions.graphs) == 1 and not draft_passes.failed


def test_passes_replay_wider_windows_as_the_answer_grows_on_cuda(cuda_prompt):
    """Graphs captured at the start over windows of 16, 32 and 64 positions of the buffer, and over
    the whole buffer: an answer of 96 tokens grows through each, and is eager AR's answer."""
    from specdemo.core.grouped_attention import use_grouped_attention
    from specdemo.core.static import compile_passes

    model = make_tiny_model().cuda()
    use_grouped_attention(model)
    passes = compile_passes(model, buckets=(1, 8, 16), windows=(16, 32, 64))
    expected = final_summary(ar.generate(model, cuda_prompt, max_new_tokens=96, eos_token_ids=())).tokens
    for method, options in ((ar, {}), (speculative, dict(draft=feature_draft(model), gamma=3, draft_tree_size=8))):
        summary = final_summary(method.generate(model, cuda_prompt, max_new_tokens=96, eos_token_ids=(), passes=passes,
                                                **options))
        assert summary.tokens == expected
    windows = {key[-1] for key in passes.graphs.graphs}
    assert {16, 32, 64} < windows and not passes.failed  # and the whole buffer
    assert passes.runs[0] <= 2  # eager: at most the prompts' passes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("queries", [2, 8, 64])
def test_grouped_rows_give_sdpa_values_on_cuda(dtype, queries):
    """A wide pass with CUDA reads the cache once per key/value head, with transformers' values."""
    query, key, value = (t.cuda() for t in inputs(dtype, 1, 6, 2, queries, cached=300))
    mask = tree_mask(queries, 300, dtype).cuda()
    assert grouped_attention.takes_grouped_path(query, key, mask, 0.0, {})
    got, _ = grouped_attention.grouped_attention_forward(Attention(3), query, key, value, mask)
    want, _ = sdpa_attention_forward(Attention(3), query, key, value, mask)
    torch.testing.assert_close(got, want)


def test_tensors_copied_without_waiting_arrive_whole():
    """`transfer.tensor_on` copies from pinned memory without waiting: each tensor arrives with its
    own values, though the host lets go of its pinned copy at once and makes the next."""
    device = torch.device("cuda")
    busy = torch.randn(2048, 2048, device=device)
    for _ in range(3):
        busy = busy @ busy / 2048  # queue work, so the copies wait behind it on the device
    arrived = [tensor_on(list(range(i, i + 64)), device) for i in range(200)]
    torch.cuda.synchronize()
    assert all(tensor.tolist() == list(range(i, i + 64)) for i, tensor in enumerate(arrived))
