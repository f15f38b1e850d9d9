"""SpecDemo's web app: `python app.py` serves it on GRADIO_SERVER_PORT (default 7860)."""

import argparse
import sys

from specdemo.app.ui import build_app, serve
from specdemo.app.zerogpu import at_start
from specdemo.core.errors import SpecDemoError
from specdemo.core.static import default_compile
from specdemo.models import AUTO, EMBEDDED, compiled, load_model
from specdemo.placement import parse_max_memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=EMBEDDED, help="model spec (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument(
        "--dtype", choices=[AUTO, "bfloat16", "float32"], default=AUTO,
        help="auto (default): bfloat16 where the GPU or CPU multiplies it natively (Ampere+, AVX-512, AMX), "
        "else float16 on a GPU and float32 on a CPU",
    )
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    parser.add_argument("--trust-remote-code", action="store_true", help="run code shipped with a Hub model")
    parser.add_argument("--device-map", default=None,
                        help="spread the model over devices (auto, balanced, balanced_low_0, sequential) or offload "
                        "every decoder layer to disk (disk), through accelerate (specdemo/placement.py)")
    parser.add_argument("--max-memory", default=None,
                        help="with --device-map: per-device limits, e.g. 0=6GiB,cpu=30GiB")
    parser.add_argument("--offload-folder", default=None, help="with --device-map: where offloaded weights go")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="compile the target's pass over a static KV cache, warmed up before serving (default: on "
                        "with CUDA, off on a CPU)")
    args = parser.parse_args()
    args.device, args.compile = at_start(args.device, args.compile)  # on ZeroGPU: on cuda, uncaptured
    try:
        target = load_model(args.model, args.dtype, args.device, args.trust_remote_code, device_map=args.device_map,
                            max_memory=parse_max_memory(args.max_memory), offload_folder=args.offload_folder)
    except SpecDemoError as error:  # a sentence, not a traceback (as the bench does)
        sys.exit(f"error: {error}")
    if default_compile(target.device) if args.compile is None else args.compile:
        # the presets loaded later are compiled too
        target = compiled(target, progress=lambda message: print(message, flush=True))
    # limits: specdemo.app.limits (SPECDEMO_* variables); GRADIO_SERVER_NAME / GRADIO_SERVER_PORT apply
    serve(build_app(target))


if __name__ == "__main__":
    main()
