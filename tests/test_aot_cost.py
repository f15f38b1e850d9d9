"""`scripts/aot_cost.py`, the prepared GPU check's measure of ZeroGPU's ahead-of-time route, on a
tiny model on a CPU: the exported pass gives the static pass's values and writes the KV buffer
the app's passes write, and a row reports every part of the route."""

import shutil

import numpy as np
import pytest
import torch

from specdemo.core import llama
from specdemo.core.kvcache import StaticKV
from specdemo.core.static import static_pass

from conftest import load_script, make_tiny_model

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None, reason="AOTInductor compiles C++ on a CPU")


def test_the_exported_pass_is_the_static_pass():
    """Run as a module (what `torch.export` traces), the pass gives the hidden states, logits and
    KV entries of `static.static_pass` run eagerly on a cache of the app's own."""
    script = load_script("aot_cost")
    model = make_tiny_model().requires_grad_(False)
    width, context = 4, 6
    module = script.ExportedPass(model, width, 64)
    inputs, layout, buffer = script.pass_inputs(model, width, context, 64)
    cache = StaticKV(model, 64, rotary=llama.rotary_table(model.get_decoder(), 64))
    cache.length = context
    with torch.inference_mode():
        hidden, logits = module(inputs, layout, buffer)
        expected, rows = static_pass(model, cache, inputs, np.arange(context, context + width),
                                     np.tri(width, dtype=bool), rows=range(width))
    torch.testing.assert_close(hidden, expected)
    torch.testing.assert_close(logits[0], rows)
    written = slice(context, context + width)
    torch.testing.assert_close(buffer[..., written, :], cache.buffer[..., written, :])
    assert not buffer[..., : context, :].any() and not buffer[..., context + width :, :].any()


@needs_compiler
@pytest.mark.parametrize("room", [0, 1 << 40], ids=["the modules' products", "joined products, as with CUDA"])
def test_the_route_is_compiled_loaded_in_a_fresh_process_and_matches_the_eager_pass(tmp_path, room):
    """With CUDA the pass's products are joined (`llama.joined_weights`): tensors of no module, which
    the export lifts as constants that the loaded package must be handed by name too."""
    script = load_script("aot_cost")
    model = make_tiny_model().requires_grad_(False)
    # one compiling process, as each test worker has one core: the suite's timing tests run beside it
    with torch._inductor.config.patch(compile_threads=1):
        row = script.measure_width(model, 8, 16, 2, tmp_path, room)
    for part in ("export_s", "compile_s", "fresh_load_s", "load_s", "package_mb", "eager ms", "ahead of time ms"):
        assert row[part] > 0, part
    assert row["eager gap"] == 0.0 and row["ahead of time gap"] < 1e-4
    assert row["eager same top tokens"] and row["ahead of time same top tokens"]
    assert not any("graphed" in key for key in row)  # CUDA graphs wait for a GPU


def test_a_way_that_fails_is_told_in_its_row_and_the_others_stand():
    """A way of running the pass that raises (on a GPU: a package run after its capture, say) costs
    its own numbers, not the width's row."""
    script = load_script("aot_cost")
    reference = torch.zeros(1, 2, 5)
    row = {"width": 1}
    script.measure_way(row, "broken", lambda: 1 / 0, reference, torch.device("cpu"), 1)
    script.measure_way(row, "eager", lambda: (None, reference), reference, torch.device("cpu"), 1)
    assert row["broken"] == "ZeroDivisionError: division by zero"
    assert row["eager gap"] == 0.0 and row["eager same top tokens"] and row["eager ms"] >= 0
