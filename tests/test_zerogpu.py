"""ZeroGPU (`specdemo.app.zerogpu`) under the stand-in of `tests/standin/spaces`: every click
declares what it plans within SPECDEMO_GPU_MAX_S and never runs past it, a first visitor is never
refused, a class of visitors all get answers, a used-up quota answers on the CPU with one sentence,
and the race is replayed and drawn outside its GPU call."""

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from gradio.context import LocalContext

from specdemo import SpecDemoError
from specdemo.app import clicks, handlers, live, views, zerogpu
from specdemo.app.limits import LIMITS
from specdemo.app.live import Request
from specdemo.models import Companions

from conftest import page_inputs

STANDIN = Path(__file__).parent / "standin"
VISITORS = 30  # a class without logins


@pytest.fixture
def spaces(monkeypatch, tmp_path):
    """The stand-in on the import path, a new day's quotas, and a fresh place to keep the pass cost."""
    monkeypatch.syspath_prepend(str(STANDIN))
    monkeypatch.delitem(sys.modules, "spaces", raising=False)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")  # as the platform sets it on a ZeroGPU Space
    monkeypatch.setenv("SPECDEMO_STATE", str(tmp_path))
    import spaces as standin

    standin.reset(quota_s=120, duration_factor=1.0)  # a visitor without a login, on an H200
    yield standin
    sys.modules.pop("spaces", None)


def as_visitor(name: str) -> None:
    """This thread's Gradio request comes from visitor `name` (the platform's x-ip-token header)."""
    LocalContext.request.set(SimpleNamespace(headers={"x-ip-token": name}, client=SimpleNamespace(host="127.0.0.1")))


def test_a_click_declares_what_it_plans_within_the_cap():
    plan = zerogpu.plan_click(2, 128, 8.0, 0.006, 30.0)
    assert plan.max_new_tokens == 128 and plan.measure_s == 8.0 and not plan.note and plan.declared_s <= 30
    timed_less = zerogpu.plan_click(2, 128, 8.0, 0.006, 10.0)
    assert timed_less.max_new_tokens == 128 and 0 < timed_less.measure_s < 8 and timed_less.declared_s <= 10 \
        and "timed" in timed_less.note
    shorter = zerogpu.plan_click(2, 512, 8.0, 0.03, 10.0)
    assert zerogpu.SHORTEST_ANSWER <= shorter.max_new_tokens < 512 and shorter.measure_s == 0 \
        and shorter.declared_s <= 10
    assert "shortened" in shorter.note
    assert zerogpu.plan_click(6, 128, 20.0, 0.006, 10.0).declared_s <= 10


@pytest.mark.parametrize("factor, runnable", [(1.0, 10), (1.5, 9), (1.3, 9)])
def test_a_click_charges_at_most_the_cap_whatever_the_gpu_kinds_duration_factor(spaces, factor, runnable):
    """ZeroGPU charges and grants a declared second times its GPU kind's factor (1.5 on an RTX PRO
    6000): a click declares its seconds divided by it, so a visitor pays at most the cap a click and
    gets at least 12 clicks a day, and the call is granted what it plans to run, within the whole
    seconds a whole number of declared ones grants (`runnable`)."""
    spaces.reset(quota_s=120, duration_factor=factor)
    for runs, tokens, measure in ((2, 128, 8.0), (2, 16, 0.0), (6, 128, 20.0), (2, 512, 8.0)):
        plan = zerogpu.plan_for(runs, tokens, measure, 10.0)
        wanted = zerogpu.plan_click(runs, plan.max_new_tokens, plan.measure_s, zerogpu.PASS_S, 100.0).declared_s
        assert plan.factor == factor and round(int(plan.declared_s) * factor) <= 10
        assert plan.granted_s >= min(wanted, runnable)
    assert spaces.QUOTA_S // round(zerogpu.whole_cap(10.0).declared_s * factor) >= 12
    assert zerogpu.whole_cap(10.0).granted_s <= 10


def test_a_new_day_keeps_the_quota_and_factor_the_environment_sets(spaces, monkeypatch):
    """`make space-check` sets a short quota in the environment: a reset without values keeps it."""
    monkeypatch.setenv("SPACES_STANDIN_QUOTA_S", "30")
    monkeypatch.setenv("SPACES_STANDIN_DURATION_FACTOR", "1.5")
    spaces.reset()
    assert (spaces.QUOTA_S, spaces.DURATION_FACTOR) == (30, 1.5)
    spaces.reset(duration_factor=1.0)
    assert (spaces.QUOTA_S, spaces.DURATION_FACTOR) == (30, 1.0)


def test_on_zerogpu_the_model_goes_to_cuda_at_start_uncaptured(spaces):
    assert zerogpu.at_start(None, None) == ("cuda", False)
    assert zerogpu.at_start(None, True) == ("cuda", False)  # no CUDA outside a GPU call: nothing to capture on
    assert zerogpu.at_start("cpu", True) == ("cpu", True)  # on the CPU the command line asks for, it gets


def test_spaces_installed_without_zerogpu_is_not_zerogpu(spaces, monkeypatch):
    """Any Gradio Space (a paid CPU one too), or a laptop, may have `spaces` installed; its GPU
    decorator then does nothing, and the app runs as asked."""
    monkeypatch.delenv("SPACES_ZERO_GPU")
    assert not zerogpu.on_zerogpu() and zerogpu.at_start(None, None) == (None, None)
    decode = lambda plan: plan  # noqa: E731
    assert zerogpu.gpu_call(decode) is decode
    monkeypatch.setenv("SPACES_ZERO_GPU", "1")
    assert zerogpu.on_zerogpu()


def readied(target, requests=()) -> tuple[list[str], object]:
    """What `clicks.ready` said it did (its `Preparing` records) and the target it returned."""
    records = clicks.ready(target, requests)
    said = []
    while True:
        try:
            said.append(next(records).what)
        except StopIteration as end:
            return said, end.value


def ready(target, requests=()):
    return clicks.quietly(clicks.ready(target, requests))


def test_a_gpu_call_captures_its_graphs_and_the_next_plan_counts_what_that_took(spaces, monkeypatch):
    captured = []
    with_graphs = SimpleNamespace(device=torch.device("cuda"), model=SimpleNamespace(), passes="graphs")
    monkeypatch.setattr(clicks, "capture", lambda target: (captured.append(target.model) or with_graphs, 0.01))
    target = SimpleNamespace(device=torch.device("cuda"), model=SimpleNamespace(), passes=None, placed=False,
                             companions=Companions())
    said, returned = readied(target)
    assert returned is with_graphs  # a fresh process: the call decodes with graphs captured in it
    assert len(said) == 1 and "capturing the model's CUDA graphs" in said[0]  # the visitor waits: the page says why
    assert captured == [target.model] and 0.01 <= zerogpu.kept("setup_s", 99.0) < 5
    assert readied(with_graphs) == ([], with_graphs)  # a worker an earlier call readied: nothing to capture or say
    cpu = SimpleNamespace(device=torch.device("cpu"), model=SimpleNamespace(), passes=None, placed=False)
    assert readied(cpu) == ([], cpu)  # on a CPU nothing is captured in a call
    assert captured == [target.model]
    fixed = zerogpu.plan_for(1, 16, 0.0, 100.0).declared_s \
        - zerogpu.decode_seconds(1, 16, zerogpu.kept("pass_s", zerogpu.PASS_S))
    assert fixed < zerogpu.SETUP_S  # the measured setup, not the estimate
    assert zerogpu.kept("start_s", 99.0) == 99.0  # a worker that spent nothing before its call: none kept
    # a fresh worker's start, kept apart from the capture: a reused worker's call, which has none, leaves it be
    declared = zerogpu.plan_for(1, 16, 0.0, 100.0).declared_s
    assert clicks.quietly(clicks.ready(target, (), before_s=3.0)) is with_graphs
    assert zerogpu.kept("start_s", 0.0) == 3.0 and zerogpu.plan_for(1, 16, 0.0, 100.0).declared_s >= declared + 2
    assert clicks.quietly(clicks.ready(target)) is with_graphs and zerogpu.kept("start_s", 0.0) == 3.0


def test_a_reused_worker_keeps_the_graphs_its_first_call_captured(embedded, spaces, monkeypatch):
    """ZeroGPU hands a later call the worker an earlier one used, with the page's uncaptured model:
    the graphs that call captured are kept with the model's companions, so this call captures
    nothing, says nothing of it, and keeps no setup for the next plan."""
    from dataclasses import replace

    from specdemo import models

    made = []
    monkeypatch.setattr(models, "compile_passes", lambda model, progress=None: made.append(model) or "graphs")
    page_model = replace(embedded, device=torch.device("cuda"), companions=Companions())  # as the worker finds it
    said, first = readied(page_model)
    assert first.passes == "graphs" and len(said) == 1 and made == [embedded.model]
    zerogpu.keep(setup_s=3.0)  # as a GPU's capture might take
    said, again = readied(page_model)
    assert again.passes == "graphs" and said == [] and made == [embedded.model]
    assert zerogpu.kept("setup_s", 0.0) == 3.0 and page_model.passes is None  # the page's model is as it was


def test_a_gpu_call_loads_its_methods_companions_and_the_next_plan_counts_what_that_took(spaces, monkeypatch):
    loaded, warmed = [], []

    def method_options(method, target):
        loaded.append(method)
        if method == "speculative":  # a draft to load and its graphs to capture, once a process
            target.companions.get("draft", lambda: time.sleep(0.05))
        return {}

    def run(target, request, stop=None):  # a short answer, whose first steps capture the tree's graph
        warmed.append((request.method, request.prompt, request.max_new_tokens))
        time.sleep(0.02)
        yield from ()

    with_graphs = SimpleNamespace(device=torch.device("cuda"), model=SimpleNamespace(), passes="graphs",
                                  companions=Companions())
    monkeypatch.setattr(clicks, "capture", lambda target: (with_graphs, 0.01))
    monkeypatch.setattr(clicks, "method_options", method_options)
    monkeypatch.setattr(clicks, "run", run)
    target = SimpleNamespace(device=torch.device("cuda"), model=SimpleNamespace(), passes=None, placed=False,
                             companions=Companions())
    requests = tuple(Request("Why is the sky blue?", method, 128) for method in ("ar", "speculative", "ar"))
    said, returned = readied(target, requests)
    assert returned is with_graphs and len(said) == 2 and said[1].startswith("getting speculative ready")
    assert loaded == ["ar", "speculative"]  # each once, in the call, before its first pass
    # a method's own short answer to the click's prompt, once: AR's graphs are the target's
    assert warmed == [("speculative", "Why is the sky blue?", clicks.WARM_TOKENS)]
    assert zerogpu.kept(zerogpu.companions_key("speculative"), 0.0) >= 0.07
    assert zerogpu.kept(zerogpu.companions_key("ar"), 99.0) == 99.0  # AR loads none: nothing kept, none counted
    zerogpu.keep(**{zerogpu.companions_key("speculative"): 3.0})  # as a GPU's draft might take
    counted = zerogpu.plan_for(2, 16, 0.0, 100.0, ("ar", "speculative")).declared_s
    assert counted >= zerogpu.plan_for(2, 16, 0.0, 100.0, ("ar",)).declared_s + 2
    # a worker an earlier click warmed (ZeroGPU reuses an idle one): its companions cost nothing, and are not kept
    assert ready(target, requests) is with_graphs
    assert zerogpu.kept(zerogpu.companions_key("speculative"), 0.0) == 3.0
    cpu = SimpleNamespace(device=torch.device("cpu"), model=SimpleNamespace(), passes=None)
    assert ready(cpu, requests[1:2]) is cpu and loaded == ["ar", "speculative"] * 2  # loaded at first use
    assert len(warmed) == 2
    # a GPU of one's own, its graphs captured at start: the short answer still goes first (a setting changed
    # on the page may need a graph), and nothing is kept for a plan; eager, nothing is captured, so nothing is run
    monkeypatch.setattr(clicks, "on_zerogpu", lambda: False)
    monkeypatch.setattr(clicks, "keep", lambda **seconds: pytest.fail("kept off ZeroGPU"))
    assert ready(with_graphs, requests[1:2]) is with_graphs and len(warmed) == 3
    eager = SimpleNamespace(device=torch.device("cuda"), model=SimpleNamespace(), passes=None, placed=False,
                             companions=Companions())
    assert ready(eager, requests[1:2]) is eager and len(warmed) == 3


def test_off_zerogpu_the_start_is_as_asked(monkeypatch):
    monkeypatch.setattr(zerogpu, "on_zerogpu", lambda: False)
    assert zerogpu.at_start(None, None) == (None, None)


def test_a_refusal_is_told_from_other_errors_and_says_when_the_quota_returns():
    import gradio as gr

    error = gr.Error("You have exceeded your ZeroGPU quota (10s requested vs. 3s left). Try again in 23:59:12. ",
                     title="ZeroGPU quota exceeded")
    assert zerogpu.refused(error) and not zerogpu.refused(gr.Error("a bad prompt")) \
        and not zerogpu.refused(ValueError())
    assert "used up" in zerogpu.refusal_sentence(error) and "23:59:12" in zerogpu.refusal_sentence(error)
    # the same title for the Space's own limit and a queue that timed out: not the visitor's quota
    for message, why in (("Space app has reached its GPU limit. Try re-running outside of examples", "its GPU limit"),
                         ("No GPU was available after 60s. Try re-running outside of examples", "after 60s")):
        sentence = zerogpu.refusal_sentence(gr.Error(message, title="ZeroGPU quota exceeded"))
        assert "used up" not in sentence and why in sentence and sentence.startswith("No GPU could take this click")


def test_a_refused_click_runs_on_the_cpu_within_the_cpus_budget_not_the_gpu_seconds_it_asked_for():
    import gradio as gr

    planned = []

    def refused_call(plan):
        raise gr.Error("You have exceeded your ZeroGPU quota (8s requested vs. 3s left).",
                       title="ZeroGPU quota exceeded")
        yield

    def on_cpu(plan):
        planned.append(plan)
        yield "answered"

    plan = zerogpu.GpuPlan(8.0, 64, 2.0)
    assert list(zerogpu.with_cpu_fallback(refused_call, on_cpu, plan)) == ["answered"]
    cpu_plan, = planned
    assert cpu_plan.on_cpu and "used up" in cpu_plan.note and cpu_plan.declared_s == 0.0
    assert handlers.click_budget(cpu_plan).left() > LIMITS.budget_s - 5  # the CPU's budget, not 8 s


@pytest.mark.parametrize("factor", [1.0, 1.5])
def test_a_first_visitor_is_never_refused_and_no_call_outruns_its_declaration(embedded, spaces, factor):
    spaces.reset(quota_s=120, duration_factor=factor)
    as_visitor("first")
    page = handlers.Handlers(handlers.Targets(embedded, ()))
    outputs = list(page.on_generate(*page_inputs("Name three colours.", "speculative", 16)))
    assert outputs and len(spaces.CALLS) == 1
    call = spaces.CALLS[0]
    assert call["visitor"] == "first" and 0 < call["charged_s"] <= LIMITS.gpu_max_s \
        and call["elapsed_s"] <= call["charged_s"]


def test_the_page_says_what_a_gpu_call_does_before_its_first_pass(embedded, spaces, monkeypatch):
    """The seconds a call spends readying its model (`clicks.ready`: a fresh process's graphs, a
    method's companions) are told in the answer's place, and in the race's, as they pass."""
    def ready(target, requests=(), before_s=0.0):
        yield clicks.Preparing("capturing")
        return target

    monkeypatch.setattr(clicks, "ready", ready)
    page = handlers.Handlers(handlers.Targets(embedded, ()))
    outputs = list(page.on_generate(*page_inputs("Name three colours.", "speculative", 8)))
    assert outputs[0]["answer"] == "<p><i>Getting the GPU ready: capturing…</i></p>"
    assert "Getting the GPU ready" not in outputs[-1].get("answer", "")
    raced = list(page.on_race("", "", "Name three colours.", ["lookahead"], 8))
    assert raced[0] == {"streams": "<p><i>Getting the GPU ready: capturing…</i></p>"}


def test_thirty_visitors_at_once_all_get_their_answers_on_the_gpu(embedded, spaces):
    generate = handlers.api_generate_for(handlers.Targets(embedded, ()))
    answers = {}

    def visit(number: int) -> None:
        as_visitor(f"student {number}")
        answers[number] = generate("Name a fruit.", "ar", 4)

    # clicks at once, served as a Gradio app's worker threads serve them
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(visit, range(VISITORS)))
    assert len(answers) == VISITORS and all(text and "note" not in stats for text, stats in answers.values())
    assert len({call["visitor"] for call in spaces.CALLS}) == VISITORS
    assert all(call["declared_s"] <= LIMITS.gpu_max_s and call["elapsed_s"] <= call["declared_s"]
               for call in spaces.CALLS)


def test_a_used_up_quota_answers_on_the_cpu_with_a_sentence_and_spares_the_others(embedded, spaces):
    generate = handlers.api_generate_for(handlers.Targets(embedded, ()))
    spaces.USED["spent"] = spaces.QUOTA_S - 1
    as_visitor("spent")
    text, stats = generate("Name a fruit.", "ar", 8)
    assert text and "used up" in stats["note"] and "23:59:12" in stats["note"]
    assert not spaces.CALLS  # refused before it ran: nothing charged, nothing run on the "GPU"
    as_visitor("fresh")
    text, stats = generate("Name a fruit.", "ar", 8)
    assert text and "note" not in stats and [call["visitor"] for call in spaces.CALLS] == ["fresh"]


def watch(monkeypatch, spaces, names: tuple[str, ...]) -> list[tuple[str, bool]]:
    """Record each call of these `views` functions, and whether it came from inside a GPU call."""
    drawn = []
    for name in names:
        real = getattr(views, name)
        monkeypatch.setattr(views, name, lambda *args, _real=real, _name=name, **kwargs:
                            drawn.append((_name, spaces.inside())) or _real(*args, **kwargs))
    return drawn


def test_generate_is_drawn_outside_its_gpu_call(embedded, spaces, monkeypatch):
    names = ("stream_html", "method_pictures", "speed_figure", "stats_html")
    drawn = watch(monkeypatch, spaces, names)
    as_visitor("drawer")
    page = handlers.Handlers(handlers.Targets(embedded, ()))
    outputs = list(page.on_generate(*page_inputs("Name three colours.", "speculative", 16)))
    assert outputs and len(spaces.CALLS) == 1 and "Same answer as AR?" in outputs[-1]["why"]
    assert {name for name, _ in drawn} == set(names) and not any(inside for _, inside in drawn)


def test_the_race_is_replayed_and_drawn_outside_its_gpu_call(embedded, spaces, monkeypatch):
    drawn = watch(monkeypatch, spaces, ("replay_frames", "race_grid", "race_figure", "race_table"))
    monkeypatch.setattr(handlers, "REPLAY_EVERY_S", 0.05)
    as_visitor("racer")
    page = handlers.Handlers(handlers.Targets(embedded, ()))
    outputs = list(page.on_race("", "", "Name three colours.", ["lookahead"], 12))
    assert outputs and len(spaces.CALLS) == 1
    assert {name for name, _ in drawn} == {"replay_frames", "race_grid", "race_figure", "race_table"} \
        and not any(inside for _, inside in drawn)


def test_measuring_is_one_gpu_call_within_the_cap_and_a_used_up_quota_measures_on_the_cpu(embedded, spaces,
                                                                                           monkeypatch):
    for name, value in (("PASS_WIDTHS", (1, 2)), ("PASS_CONTEXT", 8), ("PASS_REPEATS", 1)):
        monkeypatch.setattr(clicks, name, value)
    page = handlers.Handlers(handlers.Targets(embedded, ()))
    as_visitor("measurer")
    drawn = [update for update in page.on_measure() if "pass_cost_plot" in update]
    assert drawn and len(spaces.CALLS) == 1 and spaces.CALLS[0]["declared_s"] <= LIMITS.gpu_max_s
    assert {trace.name for trace in drawn[-1]["pass_cost_plot"].data} <= {"in memory", "offloaded"}
    spaces.USED["spent"] = spaces.QUOTA_S - 1
    as_visitor("spent")
    drawn = [update for update in page.on_measure() if "pass_cost_plot" in update]
    assert "used up" in drawn[-1]["pass_cost_note"] and len(spaces.CALLS) == 1  # refused: measured on the CPU


def test_on_zerogpu_every_model_the_page_offers_loads_at_its_start_and_never_in_a_handler(embedded, spaces,
                                                                                          monkeypatch):
    """Outside the thread that imported `spaces` nothing stands in for CUDA, so a handler (another
    thread) that loaded a model on cuda would fail: on ZeroGPU the page's other precision and its
    copy on disk load as the page is built, and a handler only looks them up. One that failed says so.
    The CPU twins of refused clicks load then too: at launch the platform deletes the Hub's model
    files whose weights it packed, so a twin loaded from them later would find none."""
    from specdemo.app import targets as offered
    from specdemo.app import ui
    from specdemo.app.targets import EXACT, Targets

    loads = []

    def load(spec, dtype, device, device_map=None):
        loads.append((spec, dtype, device_map, threading.current_thread()))
        if dtype == "float32" and device_map == "disk":
            raise RuntimeError("no room on disk")
        return SimpleNamespace(spec=spec, dtype=dtype, placed=device_map)

    monkeypatch.setattr(offered, "fast_dtype", lambda device: "bfloat16")
    monkeypatch.setattr(offered, "load_model", load)
    built = []
    monkeypatch.setattr(ui, "Targets", lambda *args, **kwargs: built.append(Targets(*args, **kwargs)) or built[-1])
    ui.build_app(embedded)
    targets, = built
    assert targets.presets == () and {(dtype, placed) for _, dtype, placed, _ in loads} == {
        ("bfloat16", None), ("bfloat16", "disk"), ("float32", "disk"),  # the start (float32, in memory) is loaded
        ("auto", None), ("auto", "disk")}  # the CPU twins
    built_with = len(loads)
    on_disk = SimpleNamespace(spec=targets.start.spec, placed="disk")
    assert targets.on_cpu(targets.start).placed is None and targets.on_cpu(on_disk).placed == "disk"
    assert len(loads) == built_with  # a refused click finds its twin loaded
    assert {thread for *_, thread in loads} == {threading.current_thread()}
    monkeypatch.setattr(offered, "load_model", lambda *args, **kwargs: pytest.fail("a handler loaded a model"))
    fast = "fast (bfloat16)"
    with ThreadPoolExecutor(1) as handler:
        assert handler.submit(targets, None, fast).result().dtype == "bfloat16"
        assert handler.submit(targets, targets.on_disk, fast).result().placed == "disk"
        assert handler.submit(targets, None, EXACT).result() is embedded
        with pytest.raises(SpecDemoError, match="did not load when this page started.*no room on disk"):
            handler.submit(targets, targets.on_disk, EXACT).result()


def test_a_calls_deadline_counts_what_its_worker_spent_before_its_first_call(tmp_path):
    """ZeroGPU counts a call's time from its grant: a forked worker's age is taken off its first
    call's deadline; the page's own process, and a worker an earlier call used (ZeroGPU reuses an
    idle one, however young), take nothing off, and their calls keep the whole deadline."""
    import multiprocessing

    old_stat, uptime = tmp_path / "stat", tmp_path / "uptime"
    old_stat.write_text("123 (python) S " + " ".join(["0"] * 18) + " 100 0 0\n")  # started 1 s after boot
    uptime.write_text("5000.0 0.0\n")  # ... and that was over an hour ago
    plan = zerogpu.GpuPlan(8.0, 64, 0.0)

    def worker(ages):
        time.sleep(0.3)
        served = set()
        with handlers.gpu_call_of(plan, served) as (first, stop):
            left = stop.left()
        with handlers.gpu_call_of(plan, served) as (second, stop):
            ages.put((first.before_s, left, second.before_s, stop.left(),
                      zerogpu.before_the_call_s(set(), old_stat, uptime)))

    with handlers.gpu_call_of(plan, set()) as (own, stop):
        assert own.before_s == 0.0 and stop.left() > 8.0 - zerogpu.MARGIN_S - 0.5
    fork = multiprocessing.get_context("fork")
    ages = fork.Queue()
    process = fork.Process(target=worker, args=(ages,))
    process.start()
    fresh, fresh_left, reused, reused_left, too_old = ages.get(timeout=30)
    process.join()
    assert 0.25 <= fresh < 5 and fresh_left < 8.0 - zerogpu.MARGIN_S - 0.25
    assert reused == 0.0 and reused_left > 8.0 - zerogpu.MARGIN_S - 0.5 and too_old == 0.0


def test_stop_ends_a_gpu_call_at_its_next_record_and_gives_the_gpu_back(embedded, spaces, monkeypatch):
    """Stop closes the page's records; ZeroGPU's worker learns of it when the call hands back its next
    record, and closes the call there: its runs stop, and the next click gets the GPU."""
    finished = []

    def recorded(target, request, stop=None):  # a slow GPU: a pass takes 200 ms
        for item in real_run(target, request, stop):
            if isinstance(item, live.Summary):
                finished.append(item.finish_reason)
            time.sleep(0.2)
            yield item

    real_run = clicks.run
    monkeypatch.setattr(clicks, "run", recorded)
    page = handlers.Handlers(handlers.Targets(embedded, ()))
    updates = page.on_generate(*page_inputs("Count from one to two hundred, one number a line.", "ar", 120))
    next(updates)
    updates.close()  # what the Stop button does
    assert len(spaces.CALLS) == 1 and finished == ["stopped"]
    monkeypatch.setattr(clicks, "run", real_run)
    assert list(page.on_generate(*page_inputs("Name a fruit.", "ar", 4))) and len(spaces.CALLS) == 2


def test_an_error_in_a_gpu_call_reaches_the_page_as_a_sentence(embedded, spaces, monkeypatch):
    """ZeroGPU sends back a `gr.Error` whole and any other error as its kind alone ("ZeroGPU worker
    error: OutOfMemoryError"): a GPU call's own errors cross as sentences."""
    import gradio as gr

    def failing(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore of the message")
        yield

    monkeypatch.setattr(clicks, "generate_records", failing)
    as_visitor("unlucky")
    page = handlers.Handlers(handlers.Targets(embedded, ()))
    with pytest.raises(gr.Error, match="The answer failed: RuntimeError: CUDA out of memory. Tried to allocate"):
        list(page.on_generate(*page_inputs("Name three colours.", "ar", 8)))


def test_a_kept_baseline_is_handed_to_the_gpu_call_and_declared_no_more(embedded, spaces, monkeypatch):
    """The page keeps each AR baseline it drew, but ZeroGPU may hand the next click a worker forked
    before then, a copy of the page without it: the page passes it into the call, which streams no
    AR and declares one decode fewer. A click ZeroGPU refused decodes its own AR on the CPU."""
    handed, runs = [], []
    real, real_plan = clicks.generate_records, handlers.plan_for
    monkeypatch.setattr(clicks, "generate_records",
                        lambda target, baseline, *rest: handed.append(baseline) or real(target, baseline, *rest))
    monkeypatch.setattr(handlers, "plan_for", lambda decodes, *rest: runs.append(decodes) or real_plan(decodes, *rest))
    as_visitor("returning")
    page = handlers.Handlers(handlers.Targets(embedded, ()))
    inputs = page_inputs("Name three colours.", "speculative", 16)
    first, again = list(page.on_generate(*inputs)), list(page.on_generate(*inputs))
    streamed_ar = ["First the AR baseline" in "".join(u.get("answer", "") for u in updates)
                   for updates in (first, again)]
    assert handed[0] is None and streamed_ar == [True, False]
    kept = page.baselines.known(embedded, live.Request("Name three colours.", "ar", 16))
    assert handed[1] is not kept and handed[1][1].tokens == kept[1].tokens  # crossed into the call as a copy
    assert runs == [2, 1]  # the decodes each call declares (the cap shortens its timing rounds alike)
    spaces.USED["returning"] = spaces.QUOTA_S - 1
    refused = list(page.on_generate(*inputs))
    assert handed[2] is None and "used up" in refused[-1]["why"] and len(spaces.CALLS) == 2
