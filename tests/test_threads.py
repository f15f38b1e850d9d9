"""`core.threads`: a thread that hands torch work to another lets its OpenMP workers go, so the
process keeps no more workers than it has CPUs while the other decodes (the module says why); and
`core.process`: torch starts no more threads than a container's CPU quota grants, and MKL's vector
math picks its kernels on one thread before any pass."""

import os
import threading

import pytest
import torch

from specdemo.app import live
from specdemo.app.live import Request
from specdemo.core.threads import gnu_openmp, let_workers_go


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.fixture
def two_torch_threads():
    """torch on two threads (a team of one worker besides the thread), whatever this machine has."""
    kept = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(kept)


def test_a_thread_that_lets_its_openmp_workers_go_keeps_none(two_torch_threads):
    if not gnu_openmp():
        pytest.skip("torch runs on another OpenMP runtime here, whose pause would end every thread's team")
    counted = {}

    def work():
        torch.ones(1 << 22).add_(1)  # wide enough for a parallel part: this thread's team starts
        counted["with its team"] = os_threads()
        counted["went"] = let_workers_go()
        counted["after"] = os_threads()
        torch.ones(1 << 22).add_(1)  # a new team, for the next parallel part
        counted["again"] = os_threads()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert counted["went"] and counted["after"] == counted["with its team"] - 1
    assert counted["again"] == counted["with its team"]


def test_a_thread_that_waits_for_a_run_lets_its_workers_go_before_the_run(embedded, monkeypatch):
    """The page's handler thread waits while the method decodes in a worker thread (`timed_events`)."""
    order = []
    monkeypatch.setattr(live, "let_workers_go", lambda: order.append(("went", threading.get_ident())))

    def events():
        order.append(("decoded", threading.get_ident()))
        yield from live.run(embedded, Request("Say yes.", "ar", 2))

    list(live.timed_events(events(), 0.1, threading.Event()))
    assert [what for what, _ in order] == ["went", "decoded"]
    assert order[0][1] == threading.get_ident() != order[1][1]


def test_a_page_handler_lets_its_workers_go_before_each_update_it_hands_over(monkeypatch):
    """Gradio runs each step of a handler in one of its worker threads, which waits between steps
    (`wiring.keyed`): an idle thread keeps no team while another decodes."""
    import gradio as gr

    from specdemo.app import wiring

    calls = []
    monkeypatch.setattr(wiring, "let_workers_go", lambda: calls.append("went"))

    def streamed():
        calls.append("step 1")
        yield {"answer": "a"}
        calls.append("step 2")
        yield {"answer": "ab"}
        calls.append("end")

    outputs = {"answer": gr.Textbox()}
    assert len(list(wiring.keyed(streamed, outputs)())) == 2
    assert calls == ["step 1", "went", "step 2", "went", "end", "went"]
    calls.clear()
    wiring.keyed(lambda: calls.append("answered") or {"answer": "a"}, outputs)()
    assert calls == ["answered", "went"]


def cgroup(tmp_path, own: str, files: dict[str, str]):
    """A stand-in /sys/fs/cgroup with `files` (paths under it), and the process's /proc/self/cgroup."""
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "own").write_text(own)
    return tmp_path, tmp_path / "own"


@pytest.mark.parametrize("own, files, quota", [
    ("0::/space\n", {"space/cpu.max": "200000 100000\n"}, 2.0),  # cgroup v2: a Space granted 2 CPUs
    ("0::/\n", {"cpu.max": "max 100000\n"}, None),  # no quota
    ("0::/\n", {"cpu.max": "765000 100000\n"}, 7.65),  # at the root, as a cgroup namespace shows it
    ("3:cpu,cpuacct:/pod\n1:memory:/other\n", {"cpu/pod/cpu.cfs_quota_us": "150000\n",
                                              "cpu/pod/cpu.cfs_period_us": "100000\n"}, 1.5),  # cgroup v1
    ("3:cpu,cpuacct:/\n", {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, None),
    ("", {}, None),  # none at all: off Linux, or no cgroup mounted
    ("0::/pod/app\n", {"pod/app/cpu.max": "max 100000\n", "pod/cpu.max": "300000 100000\n",
                       "cpu.max": "max 100000\n"}, 3.0),  # the quota on the cgroup above the process's
    ("0::/pod/app\n", {"pod/app/cpu.max": "400000 100000\n", "pod/cpu.max": "250000 100000\n"}, 2.5),  # the least
])
def test_a_cgroups_cpu_quota_is_read_as_the_cpus_it_grants(tmp_path, own, files, quota):
    from specdemo.core.process import cpu_quota

    root, own_file = cgroup(tmp_path, own, files)
    assert cpu_quota(root, own_file) == quota


def test_torch_uses_no_more_threads_than_the_quota_grants_and_at_least_one(two_torch_threads):
    """A container that sees a host's cores and is granted the time of fewer: threads beyond the
    quota only wait for the scheduler."""
    from specdemo.core.process import threads_within_quota

    assert threads_within_quota(8.0) == 2  # a quota above torch's threads leaves them
    assert threads_within_quota(1.5) == 1 and torch.get_num_threads() == 1
    torch.set_num_threads(2)
    assert threads_within_quota(0.5) == 1  # less than one CPU: still one thread


def test_settling_vector_math_calls_each_function_once_on_one_element_in_float32_and_float64():
    """One element runs on the calling thread alone: no first call of MKL's races another thread's."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from specdemo.core.process import VECTOR_MATH, settle_vector_math

    calls = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if args and isinstance(args[0], torch.Tensor):
                calls.append((func.overloadpacket.__name__, args[0].dtype, args[0].numel()))
            return func(*args, **(kwargs or {}))

    with Record():
        settle_vector_math()
    settled = [call for call in calls if call[0] in VECTOR_MATH]
    assert sorted(settled, key=str) == sorted(((name, dtype, 1) for name in VECTOR_MATH
                                               for dtype in (torch.float32, torch.float64)), key=str)
    assert {"cos", "sin", "exp", "sqrt", "tanh"} <= set(VECTOR_MATH)  # a rotary embedding's and activations' own


def test_a_load_settles_vector_math_before_it_reads_the_model(monkeypatch, tmp_path):
    from specdemo import models
    from specdemo.core.errors import SpecDemoError

    settled = []
    monkeypatch.setattr(models, "settle_vector_math", lambda: settled.append(True))
    with pytest.raises(SpecDemoError):
        models.load_model(str(tmp_path / "missing.gguf"), "float32", "cpu")
    assert settled == [True]
