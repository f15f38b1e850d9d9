"""Every setting SpecDemo makes for the whole process, in this one place, each made at load.

- **An attention implementation in transformers' registries** (`register_attention`): the name
  `grouped_sdpa` maps to `grouped_attention.grouped_attention_forward`, with SDPA's masks. Only a
  model switched to it by name (`grouped_attention.use_grouped_attention`, at load) runs it; every
  other model in the process is untouched. Made when the first model is switched.
- **For compiling on a CPU** (`compiling_on_cpu`): dynamo keeps a graph per bucket and model (a
  target, a draft, a CLLM...), more than its default limits hold; and inductor's freezing holds
  the weights as constants and prepacks them for oneDNN. torch reads freezing from its process
  config only (a `torch.compile` option does not reach it), so it holds for every later compile
  in the process: compile a model once its weights are final. Made by `static.compile_passes`,
  on a CPU only, when a model is loaded with `--compile`.

- **torch's CPU threads within the process's CPU quota** (`threads_within_quota`): a container
  (a Hugging Face Space, a Docker limit) may see a host's many cores and be granted the time of
  two. torch sizes its threads by the cores it sees, and a pass's parallel parts wait for the
  slowest of them, so threads beyond the quota only wait for the scheduler: they are cut to the
  whole CPUs the cgroup's quota grants (at least one). Made when a model loads.
- **MKL's vector math settled on one thread** (`settle_vector_math`): ATen hands float32 and
  float64 unary functions (cos, sin, exp, sqrt, tanh...) to oneMKL's vector math, which picks
  each function's kernel at its first call. With oneMKL before 2025 (torch's wheels link 2024.2),
  a first call that runs on several threads at once may run one thread's part on a low-accuracy
  kernel for that call (pytorch/pytorch#188792): a rotary embedding's cosines off by 1e-4, enough
  to flip a greedy near-tie, so a process's first answer could part from its next. One call of
  each on one element, which runs on the calling thread alone, settles every kernel first. Made
  when a model loads.

Each is idempotent: making it twice is making it once.
"""

from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

GRAPHS_PER_PROCESS = 256  # dynamo's cache and recompile limits while compiling


def register_attention(name: str, forward: Callable) -> None:
    """transformers' attention registry maps `name` to `forward`, its mask registry to SDPA's masks."""
    AttentionInterface.register(name, forward)
    AttentionMaskInterface.register(name, sdpa_mask)


def compiling_on_cpu() -> None:
    """dynamo's limits raised to GRAPHS_PER_PROCESS, and inductor's freezing on (the module's docstring says why)."""
    config = torch._dynamo.config
    config.cache_size_limit = max(config.cache_size_limit, GRAPHS_PER_PROCESS)
    if hasattr(config, "recompile_limit"):  # its newer name; torch reads both
        config.recompile_limit = max(config.recompile_limit, GRAPHS_PER_PROCESS)
    torch._inductor.config.freezing = True


# the unary functions ATen hands to oneMKL's vector math, for float32 and float64 tensors
VECTOR_MATH = ("acos", "asin", "atan", "cos", "erf", "erfc", "erfinv", "exp", "log", "log10", "log2", "sin",
               "sqrt", "tan", "tanh", "trunc")


def settle_vector_math() -> None:
    """Each VECTOR_MATH function called once on one element (within every one's domain), float32
    and float64, on the calling thread (the module's docstring says why)."""
    for dtype in (torch.float32, torch.float64):
        half = torch.full((1,), 0.5, dtype=dtype)
        for name in VECTOR_MATH:
            getattr(torch, name)(half)


def cpu_quota(root: Path = Path("/sys/fs/cgroup"), own: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPUs' worth of time this process may use: the smallest quota over its period along its
    cgroup (as `own` names it) and the cgroups above it to the root, cgroup v2's `cpu.max` or v1's
    `cpu.cfs_quota_us` and `cpu.cfs_period_us`; None without a quota, or off Linux."""
    try:
        entries = [line.split(":", 2) for line in own.read_text().splitlines() if line.count(":") >= 2]
    except OSError:
        entries = []
    unified = lineage(root, [path for _, controllers, path in entries if not controllers])
    cpu = lineage(root / "cpu", [path for _, controllers, path in entries if "cpu" in controllers.split(",")])
    quotas = [*(v2_quota(folder) for folder in unified), *(v1_quota(folder) for folder in cpu)]
    return min((quota for quota in quotas if quota is not None), default=None)


def lineage(base: Path, paths: list[str]) -> list[Path]:
    """The cgroup folders under `base` at each of `paths` and above them, up to `base` itself."""
    folders = [base]
    for path in paths:
        parts = [part for part in path.strip().split("/") if part]
        folders += [base.joinpath(*parts[:depth]) for depth in range(1, len(parts) + 1)]
    return folders


def v2_quota(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def v1_quota(folder: Path) -> float | None:
    try:
        quota, period = (int((folder / name).read_text()) for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
    except (OSError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def threads_within_quota(quota: float | None = None) -> int:
    """torch's CPU threads cut to the whole CPUs `quota` grants (default: this process's
    `cpu_quota`), at least one, where it grants fewer than torch uses (the module's docstring says
    why); the threads torch uses after."""
    quota = cpu_quota() if quota is None else quota
    if quota is not None and torch.get_num_threads() > max(1, int(quota)):
        torch.set_num_threads(max(1, int(quota)))
    return torch.get_num_threads()
