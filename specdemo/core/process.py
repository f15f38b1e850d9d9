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

Each is idempotent: making it twice is making it once.
"""

from collections.abc import Callable

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
