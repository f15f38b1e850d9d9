"""The answers of a `training.distill` folder without their features, small enough to carry:

    python scripts/gpu_tokens.py build/distill-gpu build/distill-gpu-tokens.pt.xz

An xz-compressed torch file {"plan", "prompts", "sources", "answer_starts", "tokens" (uint16, every
sequence end to end), "lengths"}. The features are a pass of the target over the tokens away
(`training.train_eagle.target_features`); on a GPU they are made with the answers, on a CPU they
cost about as long as the answers did.
"""

import io
import json
import lzma
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from training.distill import load_shards  # noqa: E402


def main(folder: str, out: str) -> None:
    data = load_shards(Path(folder), features=False)
    buffer = io.BytesIO()
    torch.save({"plan": json.loads((Path(folder) / "plan.json").read_text()), "prompts": data["prompts"], "sources": data["sources"],
                "answer_starts": data["answer_starts"], "lengths": [len(s) for s in data["sequences"]],
                "tokens": torch.tensor([t for s in data["sequences"] for t in s], dtype=torch.int32).to(torch.uint16)}, buffer)
    Path(out).write_bytes(lzma.compress(buffer.getvalue(), preset=3))
    print(f"{out}: {len(data['prompts'])} sequences, {Path(out).stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main(*sys.argv[1:3])
