"""The pass-cost measure: every width measured in turns, each pass rolled back."""

import json
from types import SimpleNamespace

import pytest

from specdemo import passcost


def loads(monkeypatch, model) -> None:
    """`passcost.main` loads `model` (a tiny one) in place of the embedded model."""
    monkeypatch.setattr(passcost, "load_model", lambda *args, **kwargs: SimpleNamespace(
        model=model, source="tiny", device=model.device, dtype=model.dtype))


def test_widths_take_turns_and_every_pass_is_rolled_back(tiny_model, monkeypatch):
    fed, lengths = [], []
    measured = passcost.target_pass

    def recorded(model, cache, ids, proposal):
        lengths.append(cache.get_seq_length())
        fed.append(proposal.size + 1)  # the proposal and the token after the cache
        return measured(model, cache, ids, proposal)

    monkeypatch.setattr(passcost, "target_pass", recorded)
    costs = passcost.pass_costs(tiny_model, widths=(1, 4, 8), context=16, repeats=2)
    assert set(costs) == {1, 4, 8} and all(cost > 0 for cost in costs.values())
    assert lengths[0] == 0  # the context is cached first, once
    assert fed[1:] == [1, 4, 8, 8, 4, 1] * 2 + [1, 4, 8]  # three warm-ups and two timed rounds, in turns
    assert lengths[1:] == [16] * 15  # each pass starts from the context: the one before was rolled back


def test_the_table_gives_each_kind_against_its_own_one_token_pass():
    report = {"device": "cpu", "dtype": "float32", "torch": "x", "context": 8,
              "eager": {1: 10.0, 8: 15.0}, "offloaded": {1: 100.0, 8: 110.0}, "graphed-sdpa": {1: 2.0, 8: 3.0}}
    table = passcost.format_table(report)
    assert "| 8 | 15.00 | 1.50x | 3.00 | 1.50x | 110.00 | 1.10x |" in table
    assert "graphed-sdpa ms" in table


def test_sdpa_times_the_graphed_pass_again_with_transformers_attention(monkeypatch):
    """`--graphs --sdpa`: the compiled pass of the loaded model (grouped attention), then the same
    model's compiled pass with transformers' SDPA, each timed; the table shows both."""
    from specdemo.core import grouped_attention
    from tests.conftest import make_tiny_model

    model = make_tiny_model()
    grouped_attention.use_grouped_attention(model)
    compiled_with = []
    loads(monkeypatch, model)
    monkeypatch.setattr(passcost, "compile_passes",
                        lambda model, progress=None: compiled_with.append(model.config._attn_implementation))
    report = passcost.main(["--graphs", "--sdpa", "--widths", "1,4", "--repeats", "1", "--context", "8"])
    assert compiled_with == [grouped_attention.NAME, "sdpa"]
    assert set(report["graphed"]) == set(report["graphed-sdpa"]) == {1, 4}
    assert "graphed-sdpa ms" in passcost.format_table(report)


def test_windowed_times_the_graphed_pass_again_over_a_window_of_the_graphs_buffer(monkeypatch):
    """`--graphs --windowed`: the compiled pass over the graphs' whole buffer, then over the window
    that holds it (`graphs.GRAPH_WINDOWS`), each timed; the table shows both."""
    from specdemo.core.graphs import GRAPH_WINDOWS
    from tests.conftest import make_tiny_model

    model = make_tiny_model()
    windows = []
    loads(monkeypatch, model)
    monkeypatch.setattr(passcost, "compile_passes",
                        lambda model, progress=None, **given: windows.append(given.get("windows", ())))
    report = passcost.main(["--graphs", "--windowed", "--widths", "1,4", "--repeats", "1", "--context", "8"])
    assert windows == [(), GRAPH_WINDOWS]
    assert set(report["graphed"]) == set(report["graphed-window"]) == {1, 4}
    assert "graphed-window ms" in passcost.format_table(report)


def test_each_kind_is_written_once_measured(monkeypatch, tmp_path, capsys):
    """A run stopped partway (here the SDPA pass fails to compile; on a GPU, a time limit) keeps in
    its --json and its output the kinds it measured before."""
    from specdemo.core import grouped_attention
    from tests.conftest import make_tiny_model

    model = make_tiny_model()
    grouped_attention.use_grouped_attention(model)  # as `load_model` does: SDPA comes last

    def compiled(model, progress=None):
        if model.config._attn_implementation == "sdpa":
            raise RuntimeError("stopped")

    loads(monkeypatch, model)
    monkeypatch.setattr(passcost, "compile_passes", compiled)
    out = tmp_path / "out.json"
    with pytest.raises(RuntimeError, match="stopped"):
        passcost.main(["--graphs", "--sdpa", "--widths", "1,4", "--repeats", "1", "--context", "8",
                       "--json", str(out)])
    kept = json.loads(out.read_text())
    assert set(kept["eager"]) == set(kept["graphed"]) == {"1", "4"} and "graphed-sdpa" not in kept
    printed = capsys.readouterr().out
    assert printed.startswith("eager: 1 ") and "\ngraphed: 1 " in printed


def test_a_kind_whose_graphs_failed_is_reported_as_failed_not_as_its_eager_times(monkeypatch, capsys):
    """Where capturing fails, the compiled pass runs eagerly (`static.static_pass`): its times
    are then eager ones, so the report gives why in place of them."""
    from specdemo.core.static import CompiledPass
    from tests.conftest import make_tiny_model

    loads(monkeypatch, make_tiny_model())
    monkeypatch.setattr(passcost, "compile_passes", lambda model, progress=None: CompiledPass(
        None, (1, 4), "cuda-graphs", failed="RuntimeError: operation not permitted when stream is capturing\nmore"))
    report = passcost.main(["--graphs", "--widths", "1,4", "--repeats", "1", "--context", "8"])
    assert "graphed" not in report and set(report["eager"]) == {1, 4}
    assert report["failed"] == {"graphed": "RuntimeError: operation not permitted when stream is capturing"}
    assert "graphed: not measured, its graphs failed" in capsys.readouterr().out
