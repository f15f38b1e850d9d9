"""SpecDemo's web app: `python app.py` serves it on GRADIO_SERVER_PORT (default 7860)."""

import argparse
import sys

from specdemo.app.ui import build_app, serve
from specdemo.app.zerogpu import at_start
from specdemo.core.errors import SpecDemoError
from specdemo.models import add_arguments, from_arguments


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    args = parser.parse_args()
    args.device, args.compile = at_start(args.device, args.compile)  # on ZeroGPU: on cuda, uncaptured
    try:
        target = from_arguments(args, progress=lambda message: print(message, flush=True))
    except SpecDemoError as error:  # a sentence, not a traceback (as the bench does)
        sys.exit(f"error: {error}")
    # limits: specdemo.app.limits (SPECDEMO_* variables); GRADIO_SERVER_NAME / GRADIO_SERVER_PORT apply
    serve(build_app(target))


if __name__ == "__main__":
    main()
