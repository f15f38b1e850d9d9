"""Where the companions trained for the embedded SmolLM2-135M-Instruct lie: folders of assets/,
each with its MANIFEST.md (how it was made). Paths only: the presets name them, the methods load them."""

from pathlib import Path

ASSETS = Path(__file__).resolve().parent.parent / "assets"
EMBEDDED_DRAFT = ASSETS / "smollm2-135m-draft"  # a token draft, two of its layers (`methods.draft`)
EMBEDDED_EAGLE = ASSETS / "smollm2-135m-eagle"  # a feature draft (`methods.eagle`)
EMBEDDED_HEADS = ASSETS / "smollm2-135m-medusa"  # Medusa heads (`methods.medusa_heads`)
EMBEDDED_CLLM = ASSETS / "smollm2-135m-cllm"  # its CLLM's adapters (`methods.cllm`)
EMBEDDED_ANSWERS = ASSETS / "smollm2-135m-answers"  # its greedy answers, the guesses' datastore (`methods.retrieval`)
