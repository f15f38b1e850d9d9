"""The answers of a `training.distill` folder without their features, small enough to carry, and back:

    python scripts/gpu_tokens.py save build/distill-gpu build/distill-gpu-tokens.pt.xz
    python scripts/gpu_tokens.py restore build/distill-gpu-tokens.pt.xz build/distill-gpu

`save` writes an xz-compressed torch file {"plan", "prompts", "sources", "answer_starts", "tokens"
(uint16, every sequence end to end), "lengths"}. `restore` makes the shards again, their features
from one pass of the target over each whole sequence (`training.train_eagle.target_features`, in
the dtype the plan names), so the trainers read them as the data run wrote them. On a GPU that pass
takes seconds; on a CPU about as long as the answers took.
"""

import io
import json
import lzma
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from specdemo.models import load_model  # noqa: E402
from training.distill import load_shards, shard_path  # noqa: E402
from training.train_eagle import target_features  # noqa: E402


def save(folder: str, out: str) -> None:
    data = load_shards(Path(folder), features=False)
    buffer = io.BytesIO()
    torch.save({"plan": json.loads((Path(folder) / "plan.json").read_text()), "prompts": data["prompts"], "sources": data["sources"],
                "answer_starts": data["answer_starts"], "lengths": [len(s) for s in data["sequences"]],
                "tokens": torch.tensor([t for s in data["sequences"] for t in s], dtype=torch.int32).to(torch.uint16)}, buffer)
    Path(out).write_bytes(lzma.compress(buffer.getvalue(), preset=3))
    print(f"{out}: {len(data['prompts'])} sequences, {Path(out).stat().st_size / 1e6:.1f} MB")


def restore(path: str, folder: str) -> None:
    data = torch.load(io.BytesIO(lzma.decompress(Path(path).read_bytes())))
    tokens = data["tokens"].to(torch.int32).tolist()
    sequences, start = [], 0
    for length in data["lengths"]:
        sequences.append(tokens[start : start + length])
        start += length
    target = load_model("embedded", data["plan"]["dtype"])
    features = target_features(target.model.get_decoder(), sequences, list(range(len(sequences))), tokens_per_batch=65536)
    out, size = Path(folder), data["plan"]["shard_size"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(json.dumps(data["plan"], indent=2) + "\n")
    for number, first in enumerate(range(0, len(sequences), size)):
        rows = range(first, min(first + size, len(sequences)))
        torch.save({"prompts": [data["prompts"][i] for i in rows], "sources": [data["sources"][i] for i in rows],
                    "sequences": [sequences[i] for i in rows], "answer_starts": [data["answer_starts"][i] for i in rows],
                    "features": [features[i][:-1].to(torch.bfloat16) for i in rows]}, shard_path(out, number))
    print(f"{folder}: {len(sequences)} sequences in {number + 1} shards")


if __name__ == "__main__":
    {"save": save, "restore": restore}[sys.argv[1]](*sys.argv[2:4])
