"""`scripts/gpu_profile.py`'s reading of a trace: the device's idle time, by the host function it waited for,
checked against a brute-force count, microsecond by microsecond, on made-up traces."""

import random
import re

import pytest

from conftest import load_script


@pytest.fixture(scope="module")
def gpu_profile():
    return load_script("gpu_profile")


def event(category: str, name: str, start: int, duration: int, thread: int = 1) -> dict:
    return {"ph": "X", "cat": category, "name": name, "ts": start, "dur": duration, "tid": thread, "pid": 1}


def made_up_trace(seed: int) -> list[dict]:
    """Device work at random, overlapping at times; this project's frames nested on one thread, with a
    frame of other code between them and a frame of ours on another thread; and other events."""
    rng = random.Random(seed)
    events, at = [], 0
    for _ in range(12):  # the device's work, from two streams: it may overlap
        at += rng.randint(0, 30)
        events.append(event(rng.choice(("kernel", "gpu_memcpy", "gpu_memset")), "work", at, rng.randint(1, 25)))
    events += [event("cuda_runtime", "cudaLaunchKernel", 5, 3), event("cpu_op", "aten::mm", 7, 4)]

    def nest(start: int, stop: int, depth: int) -> None:
        at = start
        while depth < 3 and at < stop - 2:  # frames side by side, short gaps between them
            begin = rng.randint(at, min(at + 8, stop - 2))
            end = rng.randint(begin + 1, min(begin + 60, stop))
            name = f"specdemo/f{depth}.py({rng.randint(1, 3)}): f" if rng.random() < 0.8 else "torch/x.py(1): x"
            events.append(event("python_function", name, begin, end - begin))
            nest(begin, end, depth + 1)
            at = end
    nest(0, 400, 0)
    events.append(event("python_function", "specdemo/other_thread.py(1): g", 0, 400, thread=2))
    return events


def brute_force(events: list[dict]) -> dict[str, int]:
    """Microseconds the device is idle between its first and last work, by the innermost frame of ours on thread 1."""
    work = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")]
    first, last = min(start for start, _ in work), max(stop for _, stop in work)
    frames = [e for e in events if e["cat"] == "python_function" and "specdemo/" in e["name"] and e["tid"] == 1]
    idle = {}
    for t in range(first, last):
        if any(start <= t < stop for start, stop in work):
            continue
        running = [(e["ts"], -e["dur"], i, e["name"]) for i, e in enumerate(frames)
                   if e["ts"] <= t < e["ts"] + e["dur"]]
        name = max(running)[3] if running else "(none)"  # a frame as long as its parent comes after it
        idle[name] = idle.get(name, 0) + 1
    return idle


@pytest.mark.parametrize("seed", range(20))
def test_the_device_idle_time_goes_to_the_innermost_frame_of_ours(gpu_profile, seed):
    events = made_up_trace(seed)
    expected = brute_force(events)
    table = gpu_profile.idle_by_host(events, steps=1, top=100)
    total = re.match(r"the device idle (\S+) ms a step", table)
    assert float(total.group(1)) == pytest.approx(sum(expected.values()) / 1000, abs=1e-3)
    rows = dict((name, float(ms)) for ms, name in re.findall(r"^\s*(\S+) ms  (.+)$", table, re.MULTILINE))
    assert len(expected) > 2  # the made-up trace gives the gaps to several frames
    assert rows == pytest.approx({name: micros / 1000 for name, micros in expected.items()}, abs=1e-3)


def test_a_trace_of_no_frames_gives_the_idle_time_to_none(gpu_profile):
    events = [event("kernel", "a", 0, 10), event("kernel", "b", 30, 10), event("kernel", "c", 45, 5)]
    table = gpu_profile.idle_by_host(events, steps=5)
    assert table.splitlines() == ["the device idle 0.005 ms a step (traced), while the host was in:",
                                  "   0.005 ms  (none)"]
