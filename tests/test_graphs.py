"""The CUDA-graph path (`specdemo.core.graphs`) on a CPU: `ReplayedGraphs` keeps a CUDA graph's
contract (inputs copied into fixed tensors, outputs overwritten in place by every replay, keys
and values written into the buffer the graph was captured on) by rerunning the pass, so the
plumbing around the graphs is checked here; `tests/test_cuda.py` runs the real graphs on a GPU."""

import gc
from collections import Counter
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from test_conformance import MAX_NEW_TOKENS, NAMES, configurations, eager_answers
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import DynamicCache

from specdemo.app import clicks
from specdemo.core.attention import chain_positions, sees_from_parents
from specdemo.core.events import final_summary
from specdemo.core.graphs import Captured, CudaGraphs, FunctionGraphs, Graph, layout_views, replayable
from specdemo.core.kvcache import StaticKV
from specdemo.core.static import (
    DRAFT_BUCKETS,
    CompiledPass,
    joined_forward,
    padded_layout,
    padded_width,
    request_cache,
    static_pass,
    warm_up,
)
from specdemo.core.verify import Proposal
from specdemo.methods import ar, draft_tree, medusa, speculative
from specdemo.methods.device_draft_tree import device_grow, read_tree
from specdemo.methods.draft import Draft
from specdemo.methods.eagle import FeatureDraft

from conftest import make_tiny_model
from test_eagle import feature_draft
from test_medusa import CHOICES, random_heads

BUCKETS = (1, 8, 16)
PROMPT = torch.tensor([[5, 17, 42, 8, 63, 21]])  # conftest's prompt_ids
ROOM = 1 << 40  # bytes a decoder's joined products may take: any


class Capturable(TorchDispatchMode):
    """Raises on what CUDA's stream capture refuses or records wrongly, so that a captured
    function on a CPU fails where its capture would on a GPU: a value read on the host
    (`.item()`, `bool()`, `int()`), a shape that depends on values (`nonzero`, a boolean index,
    `repeat_interleave` without its output's size, `unique`), a tensor made from host data (the
    graph would copy from that host memory at every replay, whatever it holds then)."""

    READS = frozenset({"item", "_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim",
                       "unique_consecutive", "equal", "is_nonzero", "lift_fresh", "lift_fresh_copy"})

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind = func.overloadpacket.__name__
        tensors = [arg for arg in (args[1] if kind in ("index", "index_put", "index_put_") else ())
                   if isinstance(arg, torch.Tensor)]
        if (kind in self.READS or any(tensor.dtype == torch.bool for tensor in tensors)
                or (kind == "repeat_interleave" and (kwargs or {}).get("output_size") is None)):
            raise RuntimeError(f"{func} cannot be captured in a CUDA graph")
        return func(*args, **(kwargs or {}))


@contextmanager
def capturing():
    """`Capturable`, and `Tensor.tolist` raising: a copy to the host (waits for the device,
    which capture forbids)."""
    tolist = torch.Tensor.tolist

    def refused(self):
        raise RuntimeError("tolist cannot be captured in a CUDA graph")

    torch.Tensor.tolist = refused
    try:
        with Capturable():
            yield
    finally:
        torch.Tensor.tolist = tolist


class ReplayedGraphs(CudaGraphs):
    """CUDA graphs' contract without CUDA: a replay reruns the captured pass on the captured
    tensors and writes its result into the captured outputs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.functions = ReplayedFunctionGraphs()

    def capture(self, forward, decoder, cache, inputs, layout, bucket, head, layers) -> Graph:
        inputs, layout = inputs.clone(), layout.clone()
        # the window of the buffer the view shares (a graph holds its addresses, not the request's view)
        run = replayable(forward, decoder, self.cache.window(cache.capacity), inputs, layout, bucket, head, layers)
        with capturing():
            out = run()

        class Replay:
            def replay(self):
                with capturing():
                    new = run()
                for mine, theirs in zip(out if isinstance(out, tuple) else (out,),
                                        new if isinstance(new, tuple) else (new,)):
                    mine.copy_(theirs)

        return Graph(Replay(), inputs, layout, out)


def graphed(model, capacity: int = 256, buckets: tuple[int, ...] = BUCKETS, role: str = "target"):
    """`model` with the graph path `static.compile_passes` builds with CUDA (its products joined),
    replayed on a CPU."""
    passes = CompiledPass(joined_forward(model.get_decoder(), ROOM), buckets, "cuda-graphs",
                          graphs=ReplayedGraphs(model, capacity))
    warm_up(model, passes, None, role)
    return passes


@pytest.fixture(scope="module")
def graphed_models():
    target, other = make_tiny_model(), make_tiny_model(seed=1)
    configs = configurations(target, other)
    expected = eager_answers(configs)  # eager, on the reference's weights
    return target, configs, expected, {id(model): graphed(model) for model in (target, configs["cllm, jacobi"][2])}


def test_warm_up_captures_one_graph_a_bucket(graphed_models):
    target, _, _, graphed = graphed_models
    passes = graphed[id(target)]
    assert sorted(key[0] for key in passes.graphs.graphs) == list(BUCKETS)
    assert not passes.failed and not passes.runs


@pytest.mark.parametrize("name", [name for name in NAMES if name not in ("beam", "contrastive")])
def test_every_method_gives_ars_answer_through_the_graphs(graphed_models, prompt_ids, name):
    target, configs, expected, graphed = graphed_models
    generate, options, reference = configs[name]
    passes = graphed[id(reference)]
    before = sum(passes.runs[width] for width in BUCKETS)
    given = {"passes": passes, **({"cllm_passes": passes} if name.startswith("cllm") else {})}
    summary = final_summary(generate(reference if name.startswith("cllm") else target, prompt_ids,
                                     max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=(), **options, **given))
    assert summary.tokens == expected[name]
    # all but the prompt's pass replayed a graph
    assert sum(passes.runs[width] for width in BUCKETS) - before >= summary.target_forwards - 1
    assert not passes.failed


@pytest.mark.parametrize("name", ["ar", "speculative, feature draft, tree", "medusa, dynamic tree", "lookahead"])
def test_a_pass_attends_over_the_smallest_window_that_holds_it(graphed_models, prompt_ids, name):
    """A graphed pass reads the buffer's first positions: the smallest window holding the valid
    length and its padded nodes, else the whole buffer. Every bucket's graph over every window
    that can hold it is captured at the start; as an answer grows its passes replay the graphs of
    wider windows, and it is still AR's answer."""
    target, configs, expected, _ = graphed_models
    generate, options, reference = configs[name]
    passes = CompiledPass(joined_forward(target.get_decoder(), ROOM), BUCKETS, "cuda-graphs",
                          graphs=ReplayedGraphs(target, 256, (8, 16, 32)))
    warm_up(target, passes, None, "target")
    captured = {(key[0], key[-1]) for key in passes.graphs.graphs}  # (width, window)
    assert captured == {(width, span) for width in BUCKETS for span in (8, 16, 32, 256) if width <= span}
    replays = Counter()
    for graph in passes.graphs.graphs.values():
        graph.graph.replay = counted(graph.graph.replay, replays, graph.out)
    summary = final_summary(generate(target, prompt_ids, max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=(),
                                     passes=passes, **options))
    assert summary.tokens == expected[name]
    windows = {key[-1] for key in passes.graphs.graphs if replays[id(passes.graphs.graphs[key].out)]}
    assert {16, 32} <= windows  # the prompt and its answer reach 30 positions
    assert (256 in windows) == (name != "ar")  # a pass of 8 or 16 tokens past 24 positions reads the whole buffer
    assert {(key[0], key[-1]) for key in passes.graphs.graphs} == captured  # nothing captured mid-answer
    assert not passes.failed and sum(passes.runs[width] for width in BUCKETS) >= summary.target_forwards - 1


def counted(replay, replays: Counter, out):
    """`replay`, counting its calls in `replays` under its graph's output."""
    def run():
        replays[id(out)] += 1
        return replay()
    return run


def test_the_buffer_is_lent_to_one_request_at_a_time(graphed_models):
    target, _, _, graphed = graphed_models
    passes = graphed[id(target)]
    graphs = passes.graphs
    first = request_cache(target, 40, passes)
    assert graphs.serves(first) and padded_width(first) is not None
    second = request_cache(target, 40, passes)  # the buffer is lent: a buffer of its own, run eagerly
    assert isinstance(second, StaticKV) and not graphs.serves(second) and padded_width(second) is None
    del first, second
    gc.collect()
    again = request_cache(target, 40, passes)
    assert graphs.serves(again) and again.get_seq_length() == 0
    assert not graphs.serves(request_cache(target, 10_000, passes))  # longer than the graphs' buffer


def test_a_request_longer_than_the_graphs_buffer_runs_eagerly_over_a_cache_of_its_own():
    """Its passes attend over windows of its own cache, not the graphs' (whose window would stop
    at their buffer's end, and whose positions past it the pass would write out of bounds)."""
    model = make_tiny_model(context=1024)
    prompt = torch.randint(0, 97, (1, 240), generator=torch.Generator().manual_seed(0))
    expected = final_summary(ar.generate(model, prompt, max_new_tokens=40, eos_token_ids=())).tokens
    passes = graphed(model, capacity=256)
    summary = final_summary(ar.generate(model, prompt, max_new_tokens=40, eos_token_ids=(), passes=passes))
    assert summary.tokens == expected and not passes.failed and passes.runs[0] == summary.target_forwards


def test_a_padded_slot_never_changes_a_graphed_pass(prompt_ids):
    """A graph's padded slots keep whatever an earlier pass fed them (only the fed tokens are
    copied in): a pass of 3 tokens in the 8-wide graph gives the same hidden states and logits
    after a pass that filled all 8 slots with other tokens as after one that left them zero."""
    model = make_tiny_model()
    tree = [-1, 0, 0]
    tokens = torch.tensor([[7, 11, 13]])
    results = []
    for earlier in (torch.zeros(1, 8, dtype=torch.long), torch.randint(3, 100, (1, 8))):
        passes = graphed(model)
        with torch.inference_mode():
            cache = request_cache(model, 64, passes)
            static_pass(model, cache, prompt_ids, np.arange(prompt_ids.shape[1]),
                        np.tri(prompt_ids.shape[1], dtype=bool))
            n, before = cache.length, passes.runs[8]
            static_pass(model, cache, earlier, np.arange(n, n + 8), np.tri(8, dtype=bool),
                        rows=range(8))  # the same graph as the pass below: ids fed, the LM head inside
            cache.length = n
            sees = sees_from_parents(tree)
            results.append(static_pass(model, cache, tokens, chain_positions(sees, n), sees, rows=range(3)))
            assert passes.runs[8] - before == 2 and key_of_width(passes, 8)  # both passes replayed the 8-wide graph
        del cache
        gc.collect()
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=0, atol=0)


def key_of_width(passes, width: int) -> bool:
    return any(key[0] == width for key in passes.graphs.graphs)


def trees_through_graphs(target, draft, **options) -> tuple[list, list, CompiledPass]:
    """`draft`'s speculative runs on a graphed target, the draft eager, then replaying its graphs
    (`graphed`), and those graphs."""
    draft_passes = graphed(draft.model, buckets=DRAFT_BUCKETS, role="draft")
    runs = [list(speculative.generate(target, PROMPT, passes=graphed(target), draft=draft, draft_passes=passes,
                                      max_new_tokens=MAX_NEW_TOKENS, **options))
            for passes in (None, draft_passes)]
    return runs[0], runs[1], draft_passes


def looked_back(passes: CompiledPass) -> list[tuple]:
    """The graphs' kinds whose nodes look back at nodes fed before them: a node's columns
    (`static.padded_layout`) beyond its pass's width and the two framing ones."""
    return [key for key in passes.graphs.graphs if key[1] > key[0] + 2]


def test_a_deep_token_draft_tree_replays_its_drafts_look_back_passes():
    """A token draft's tree 4 deep: from its third level on, a draft pass looks back at the
    branches fed before it. With graphs, those passes replay graphs of their own look-back
    window too, and every tree is the one the draft's eager passes grow, node for node; the
    answer is AR's."""
    target = make_tiny_model()
    eager, replayed, draft_passes = trees_through_graphs(target, Draft("other", make_tiny_model(seed=1)), gamma=4,
                                                         draft_tree_size=12, draft_tree_top_k=3, eos_token_ids=())
    assert final_summary(replayed).tokens == final_summary(eager).tokens == answer_of(target)
    trees = [[(event.proposed, event.accepted) for event in events[:-1]] for events in (eager, replayed)]
    assert trees[0] == trees[1] and max(len(proposed) for proposed, _ in trees[1]) > 8
    assert looked_back(draft_passes) and draft_passes.runs[0] == 0  # no draft pass ran eagerly


@pytest.mark.parametrize("ends", [False, True])
def test_a_feature_drafts_tree_grows_on_the_device_in_one_graph(ends):
    """A feature draft's dynamic tree on its graphs' buffer grows in one graph
    (`device_draft_tree`), read once a step: each step's tree is the one the host grows from the
    draft's eager passes, node for node and value for value, and the answer is AR's. With `ends`,
    a token the draft proposes ends the answer: such a node is not expanded, there as here."""
    target = make_tiny_model()
    draft = fed_its_tokens(feature_draft(target))
    options = dict(gamma=4, draft_tree_size=12, draft_tree_top_k=3, eos_token_ids=())
    if ends:  # a token the draft proposes that the answer never holds
        proposed = Counter(token for event in trees_through_graphs(target, draft, **options)[0][:-1]
                           for token in event.proposed)
        options["eos_token_ids"] = (next(token for token, _ in proposed.most_common()
                                         if token not in answer_of(target)),)
    eager, replayed, draft_passes = trees_through_graphs(target, draft, **options)
    assert final_summary(replayed).tokens == final_summary(eager).tokens == answer_of(target, options["eos_token_ids"])
    trees = [[(event.proposed, event.accepted) for event in events[:-1]] for events in (eager, replayed)]
    assert trees[0] == trees[1] and max(len(proposed) for proposed, _ in trees[1]) > 8
    values = [[score for event in events[1:-1] for score in event.data.tree.scores] for events in (eager, replayed)]
    torch.testing.assert_close(values[1], values[0], rtol=0, atol=1e-6)
    functions = draft_passes.graphs.functions
    assert {kind[0][0] for kind in functions.graphs} == {"dynamic draft tree"}
    assert functions.replays == len(replayed) - 2  # every step but the first, which drafts nothing
    # one graph, whatever the length of the branch copied beside the tree, though a tree's size on the compiled
    # path depends on it (`static.fitted_size`), and near the answer's end, where a step keeps fewer levels
    sizes = Counter(sum(source == "draft" for source in event.data.tree.sources) for event in replayed[1:-1])
    rooms = MAX_NEW_TOKENS - np.cumsum([0, *(len(event.committed) for event in replayed[:-2])])  # before each pass
    assert len(sizes) > 1 and min(rooms[1:]) <= 4 and len(functions.graphs) == 1  # a step of room 4 keeps 3 levels
    assert not looked_back(draft_passes) and draft_passes.runs[0] == 0  # no level ran a pass of its own


def fed_its_tokens(draft: FeatureDraft) -> FeatureDraft:
    """`draft` with its `fc` perturbed. `feature_draft`'s passes the feature through: siblings in a
    tree, fed one state and different tokens, then have one state, and a node that saw the wrong
    sibling goes unnoticed."""
    with torch.no_grad():
        draft.fc.weight.add_(0.1 * torch.randn_like(draft.fc.weight))
    return draft


def answer_of(target, eos: tuple[int, ...] = ()) -> tuple[int, ...]:
    return final_summary(ar.generate(target, PROMPT, max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=eos)).tokens


def test_a_static_draft_tree_drafts_its_levels_in_one_graph(prompt_ids):
    """A feature draft's static tree on its graphs' buffer drafts every level after the first
    pass in one graph (`static_draft_tree.graphed_levels`), captured once and replayed every step
    that drafts the tree; each step's tree is the one the draft's eager passes draft, and the
    answer is AR's."""
    target = make_tiny_model()
    draft = fed_its_tokens(feature_draft(target))
    options = dict(draft=draft, gamma=3, draft_tree_top_k=2, static_tree=True, max_new_tokens=MAX_NEW_TOKENS,
                   eos_token_ids=())
    draft_passes = graphed(draft.model, buckets=DRAFT_BUCKETS, role="draft")
    runs = [list(speculative.generate(target, prompt_ids, passes=graphed(target), draft_passes=passes, **options))
            for passes in (None, draft_passes)]  # the draft eager, then replaying its graphs
    reference = final_summary(ar.generate(target, prompt_ids, max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=()))
    assert final_summary(runs[1]).tokens == final_summary(runs[0]).tokens == reference.tokens
    trees = [[(event.proposed, event.accepted) for event in events[:-1]] for events in runs]
    assert trees[0] == trees[1]
    values = [[score for event in events[1:-1] for score in event.data.tree.scores] for events in runs]
    torch.testing.assert_close(values[1], values[0], rtol=0, atol=1e-6)  # each node's log-probability too
    static_steps = sum(len(event.proposed) >= 14 for event in runs[1][:-1])  # 2 + 4 + 8 nodes and any copy
    functions = draft_passes.graphs.functions  # near the answer's end, too short for the tree: a grown one
    assert [kind[0][0] for kind in functions.graphs].count("static draft tree") == 1
    assert functions.replays >= static_steps > 2
    # no level ran a pass of its own: the draft's graphs are the warm-up's, for its first pass
    assert {key[0] for key in draft_passes.graphs.graphs} == set(DRAFT_BUCKETS) and draft_passes.runs[0] == 0


class ReplayedFunctionGraphs(FunctionGraphs):
    """`FunctionGraphs`' contract without CUDA: a replay reruns the captured function on the
    captured inputs and writes its result into the captured outputs."""

    def __init__(self):
        super().__init__()
        self.replays = 0

    def capture(self, function, inputs) -> Captured:
        with capturing():
            out = function(*inputs)
        graphs = self

        class Replay:
            def replay(self):
                graphs.replays += 1
                with capturing():
                    new = function(*inputs)
                for mine, theirs in zip(out, new):
                    mine.copy_(theirs)

        return Captured(Replay(), inputs, out, function)


@pytest.mark.parametrize("tree, tree_size, reads_token",
                         [("dynamic", 6, False), ("dynamic", 12, True), (CHOICES, None, False)])
def test_medusas_heads_replay_their_graphs(prompt_ids, tree, tree_size, reads_token):
    """With graphs of the heads beside the target's, every proposal after the prompt's pass
    replays one, and each pass proposes the very tree the eager heads propose: the answer is the
    eager one, AR's. Heads that read the token each state predicted (the embedded model's) take
    it as an input of their graph."""
    target = make_tiny_model()
    heads = random_heads(target, reads_token=reads_token)
    graphs = ReplayedFunctionGraphs()
    runs = [list(medusa.generate(target, prompt_ids, heads=heads, tree=tree, tree_size=tree_size, max_new_tokens=24,
                                 eos_token_ids=(), passes=graphed(target), heads_passes=given))
            for given in (None, graphs)]
    proposed = [[event.proposed for event in run[:-1]] for run in runs]
    assert proposed[0] == proposed[1] and final_summary(runs[0]).tokens == final_summary(runs[1]).tokens
    assert graphs.replays == len(proposed[1]) - 1 > 2  # every pass but the prompt's
    # the heads rank as many tokens whatever a pass's tree takes beside its copy: one graph, captured once
    assert len(graphs.graphs) == 1


def test_a_function_graph_returns_its_outputs_own_copies():
    """A call's outputs outlive the next call of the same graph, which overwrites the graph's."""
    graphs = ReplayedFunctionGraphs()
    double = lambda x: (2 * x,)  # noqa: E731
    first = graphs("double", double, torch.ones(3))
    second = graphs("double", double, torch.full((3,), 5.0))
    assert first[0].tolist() == [2.0] * 3 and second[0].tolist() == [10.0] * 3
    assert len(graphs.graphs) == 1 and graphs.replays == 2
    graphs("double", double, torch.ones(4))  # another shape: a graph of its own
    assert len(graphs.graphs) == 2


def test_a_layout_reads_back_as_the_positions_start_and_sees_it_was_built_from():
    """A pass's layout reaches its graph as one buffer; its views give back the padded layout."""
    positions = np.array([300, 301, 301])
    sees = np.random.default_rng(0).random((3, 5)) > 0.5  # 2 look back, 3 fed
    view = layout_views(padded_layout(positions, sees, 4, look_back=8, start=299), 4)
    assert view.positions.tolist() == [[300, 301, 301, 301]] and view.start.dim() == 0 and int(view.start) == 299
    assert view.slots.tolist() == [299, 300, 301, 302] and int(view.first) == 299 - 8 - 1
    expected = torch.zeros(4, 14, dtype=torch.bool)
    expected[:, :9] = True  # the cache before the window, then the window's columns, seen by every node
    expected[:3, 7:12] = torch.from_numpy(sees)  # but where `sees` says otherwise
    expected[3, 12] = True  # the padded node sees itself alone; the last column, past the pass, none
    assert torch.equal(view.sees, expected.to(torch.uint8))  # bytes, 1 where a node sees


def test_every_candidate_a_device_grown_tree_drafts_has_its_paths_value():
    """Checked against a brute-force reference: each of the candidates `device_grow` drafts (all
    of them, the tree taking more nodes than there are) has the value of its path drafted as a
    chain by the draft's eager passes, token by token from the same first pass (the sum of each
    token's log-probability after its ancestors), and is among its parent's k best children. So
    each level's nodes see their own ancestors at their positions, and nothing else drafted. A
    smaller tree is the rerank of those candidates."""
    target = make_tiny_model()
    draft, depth, k = fed_its_tokens(feature_draft(target)), 4, 3
    with torch.no_grad():  # its children's values differ by far
        target.get_output_embeddings().weight.mul_(30)  # shared with the draft
    passes = graphed(draft.model, buckets=DRAFT_BUCKETS, role="draft")
    with torch.inference_mode():
        features = target.model(PROMPT).last_hidden_state[:, :-1]  # those of the pairs the draft reads
        cache = request_cache(draft.model, 64, passes)
        first = draft_tree.first_logits(draft, cache, PROMPT, features)
        tree = read_tree(device_grow(draft, cache, first, depth=depth, top_k=k, most=10_000), 10_000)
        assert passes.graphs.functions.graphs and tree.size == k + (depth - 1) * k * k
        # the graph keeps the candidates the rerank keeps, and any smaller tree is cut from them
        kept = device_grow(draft, cache, first, depth=depth, top_k=k, most=12)
        assert kept.table.shape == (3, 12)
        for size in (1, 5, 10, 12):
            assert read_tree(kept, size) == draft_tree.best_nodes(tree, size)
        # a step keeping fewer levels replays the same graph and keeps the nodes of the tree that deep
        graphs = dict(passes.graphs.functions.graphs)
        for levels in (1, 2, 3):
            shallow = read_tree(device_grow(draft, cache, first, depth=depth, top_k=k, most=12, levels=levels), 12)
            shallower = Proposal(**{field: tuple(getattr(tree, field)[n] for n in range(tree.size)
                                                 if tree.depths[n] <= levels)
                                    for field in ("tokens", "parents", "sources", "scores")})
            assert shallow == draft_tree.best_nodes(shallower, 12) and max(shallow.depths) == levels
        assert passes.graphs.functions.graphs == graphs
        for node in range(tree.size):
            steps = speculative.draft_logits(draft, DynamicCache(config=draft.model.config), PROMPT, features)
            logits, value = next(steps), 0.0
            for n in tree.ancestry(node):
                log_probs = torch.log_softmax(logits[-1].float(), dim=-1)
                assert tree.tokens[n] in log_probs.topk(k).indices.tolist()
                value += float(log_probs[tree.tokens[n]])
                if n != node:
                    logits = steps.send(torch.tensor([[tree.tokens[n]]]))
            assert tree.scores[node] == pytest.approx(value, abs=1e-4)


@pytest.mark.parametrize("method", ["dynamic tree", "static tree", "medusa"])
def test_a_short_answer_captures_every_graph_a_longer_one_replays(prompt_ids, method):
    """A click on a GPU answers its request `clicks.WARM_TOKENS` long before the answer a visitor
    watches (`clicks.warmed`): that short answer captures every graph the whole answer
    replays (the target's, the draft's passes, its tree's, Medusa's heads'), so none is captured
    while the answer is timed, not even near its end, where a step keeps fewer levels."""
    target = make_tiny_model()
    passes, functions = graphed(target), ReplayedFunctionGraphs()
    draft, draft_passes, heads = fed_its_tokens(feature_draft(target)), None, random_heads(target)
    if method != "medusa":
        draft_passes = graphed(draft.model, buckets=DRAFT_BUCKETS, role="draft")
        draft_passes.graphs.functions = functions

    def answer(tokens: int):
        common = dict(max_new_tokens=tokens, eos_token_ids=(), passes=passes)
        if method == "medusa":
            return medusa.generate(target, prompt_ids, heads=heads, tree_size=12, heads_passes=functions,
                                   **common)
        shape = dict(static_tree=True) if method == "static tree" else dict(draft_tree_size=12)
        return speculative.generate(target, prompt_ids, draft=draft, gamma=3, draft_tree_top_k=3,
                                    draft_passes=draft_passes, **shape, **common)

    def captured() -> list[set]:
        return [set(passes.graphs.graphs), set(functions.graphs),
                set(draft_passes.graphs.graphs) if draft_passes else set()]

    final_summary(answer(clicks.WARM_TOKENS))
    warm, replays = captured(), functions.replays
    summary = final_summary(answer(MAX_NEW_TOKENS))
    assert warm[1] and functions.replays - replays >= summary.target_forwards - 2
    assert captured() == warm and summary.tokens == answer_of(target)


class FailingFunctionGraphs(ReplayedFunctionGraphs):
    """Function graphs whose capture fails as a CUDA capture does on an operation it refuses: the
    capture's end then fails on its own, with an error that names nothing of the first."""

    def capture(self, function, inputs) -> Captured:
        try:
            raise RuntimeError("Cannot copy between CPU and CUDA tensors during CUDA graph capture\nthe rest")
        finally:  # torch.cuda.graph's exit ends the capture
            raise RuntimeError("operation failed due to a previous error during capture")  # noqa: B012


@pytest.mark.parametrize("method", ["speculative", "medusa"])
def test_a_function_graph_that_fails_to_capture_runs_eagerly_after_one_warning(prompt_ids, method, caplog):
    """A tree's or the heads' graph that cannot be captured says so once; every call then runs its
    function eagerly, and the answer is still AR's."""
    target = make_tiny_model()
    functions = FailingFunctionGraphs()
    common = dict(max_new_tokens=MAX_NEW_TOKENS, eos_token_ids=(), passes=graphed(target))
    if method == "medusa":
        events = medusa.generate(target, prompt_ids, heads=random_heads(target), tree_size=12,
                                 heads_passes=functions, **common)
    else:
        draft = fed_its_tokens(feature_draft(target))
        draft_passes = graphed(draft.model, buckets=DRAFT_BUCKETS, role="draft")
        draft_passes.graphs.functions = functions
        events = speculative.generate(target, prompt_ids, draft=draft, gamma=3, draft_tree_size=12, draft_tree_top_k=3,
                                      draft_passes=draft_passes, **common)
    with caplog.at_level("WARNING", logger="specdemo.core.graphs"):
        summary = final_summary(events)
    assert summary.tokens == answer_of(target)
    assert functions.failed == ("RuntimeError: operation failed due to a previous error during capture; during "
                                "RuntimeError: Cannot copy between CPU and CUDA tensors during CUDA graph capture")
    assert not functions.graphs
    assert [record.message.count("running it eagerly") for record in caplog.records] == [1]
    assert "Cannot copy between CPU and CUDA tensors" in caplog.records[0].message  # the first error, not only CUDA's
