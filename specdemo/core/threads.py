"""The OpenMP workers a thread keeps after running torch, and letting them go.

On a CPU torch runs the parallel parts of its operations on OpenMP. GNU OpenMP (libgomp, which
torch's Linux wheels bundle) gives every thread that ran a parallel part a team of its own workers
and keeps it for the thread's life. Once the process keeps more workers than it has CPUs, libgomp
stops spinning between parallel parts and sleeps instead, so each of a model's many small parts
waits for a wake-up: a thread that decodes while another thread keeps a team (the app's main
thread, which loaded the model; a page's handler thread, which ran a check) decodes much slower
than the same thread alone.

So a thread that hands its torch work to another and only waits lets its team go first
(`let_workers_go`); its next parallel part starts a new team. That is libgomp's
`omp_pause_resource_all`, which acts on the calling thread's team alone. With another OpenMP
runtime, or none, it does nothing: LLVM's and Intel's hard pause ends the whole runtime, every
thread's team with it. GNU OpenMP is not fork-safe: in a forked process, the thread copied from a
thread that kept a team hangs at its next parallel part or pause, while a thread started in the
forked process has a team of its own (ZeroGPU runs each call in such a thread of its worker).
"""

import ctypes
from pathlib import Path

OMP_PAUSE_HARD = 2  # OpenMP 5's omp_pause_hard: the workers end, not just sleep


def gnu_openmp(maps: Path = Path("/proc/self/maps")) -> list[ctypes.CDLL]:
    """Every GNU OpenMP library this process has loaded (torch's, and another package's own copy,
    if any): none with another runtime, none at all, or off Linux."""
    try:
        loaded = {line.split()[-1] for line in maps.read_text().splitlines() if "/libgomp" in line}
    except OSError:
        return []
    libraries = []
    for path in sorted(loaded):
        try:
            libraries.append(ctypes.CDLL(path))
        except OSError:
            continue
    return libraries


def let_workers_go() -> bool:
    """End the calling thread's OpenMP teams, in each GNU OpenMP library loaded, where the thread is
    in no parallel part (the module's docstring says why); whether one ended."""
    ended = False
    for library in gnu_openmp():
        pause = getattr(library, "omp_pause_resource_all", None)  # OpenMP 5: GCC 9 on
        ended = (pause is not None and pause(OMP_PAUSE_HARD) == 0) or ended
    return ended
