"""The answers of a `training.distill` folder without their features, small enough to carry, and back:

    python -m training.carry save build/distill-gpu build/distill-gpu-tokens.pt.xz
    python -m training.carry restore build/distill-gpu-tokens.pt.xz build/distill-gpu [DTYPE [LIMIT]]

A lent GPU returns at most a few files of 16 MiB, and a shard folder holds gigabytes of features.
`save` writes an xz-compressed torch file {"plan", "prompts", "sources", "answer_starts", "lengths",
"tokens" (uint16, every sequence end to end)}: about 1 MB per million tokens. `restore` makes the
shards again, each feature from one pass of the target over the whole sequence
(`train_eagle.target_features`, in the dtype the plan names; the data run's incremental features
equal a full pass's, `tests/test_distill.py`), so the trainers read them as the data run wrote them.
On a GPU that pass takes seconds; on a CPU minutes, far less than answering: on 2 cores of an
AMD EPYC with AVX-512 BF16 the first 5,000 of 16,384 answers (1.02M tokens) took 7.5 min in
bfloat16 and all of them (3.35M tokens) 23 min, whose features the Medusa trainer reads as they are (it keeps its hidden states in
bfloat16); a `limit` restores the plan's first answers only.
"""

import io
import json
import lzma
import sys
from pathlib import Path

import torch

from specdemo.models import load_model

from .distill import load_shards, shard_path
from .train_eagle import target_features


def save(folder: Path, out: Path) -> None:
    data = load_shards(folder, features=False)
    buffer = io.BytesIO()
    torch.save({"plan": json.loads((folder / "plan.json").read_text()), "prompts": data["prompts"], "sources": data["sources"],
                "answer_starts": data["answer_starts"], "lengths": [len(s) for s in data["sequences"]],
                "tokens": torch.tensor([t for s in data["sequences"] for t in s], dtype=torch.int32).to(torch.uint16)}, buffer)
    out.write_bytes(lzma.compress(buffer.getvalue(), preset=3))
    print(f"{out}: {len(data['prompts'])} sequences, {out.stat().st_size / 1e6:.1f} MB")


def restore(path: Path, folder: Path, target=None, dtype: str | None = None, limit: int | None = None) -> None:
    """The shards `save` carried, under `folder`, their features from `target` (default: the
    embedded model in `dtype`, by default the plan's); with `limit`, the first `limit` answers
    only (the plan's order is shuffled, so they are a sample of its mix)."""
    data = torch.load(io.BytesIO(lzma.decompress(path.read_bytes())))
    tokens = data["tokens"].to(torch.int32).tolist()
    sequences, start = [], 0
    for length in data["lengths"][:limit]:
        sequences.append(tokens[start : start + length])
        start += length
    target = target or load_model("embedded", dtype or data["plan"]["dtype"])
    # batches of 8,192 tokens: on 2 CPU cores 65,536 ran at half the rate (attention over long rows)
    tokens_per_batch = 65536 if target.model.device.type == "cuda" else 8192
    features = target_features(target.model.get_decoder(), sequences, list(range(len(sequences))), tokens_per_batch=tokens_per_batch)
    size = data["plan"]["shard_size"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "plan.json").write_text(json.dumps(data["plan"], indent=2) + "\n")
    for number, first in enumerate(range(0, len(sequences), size)):
        rows = range(first, min(first + size, len(sequences)))
        torch.save({"prompts": [data["prompts"][i] for i in rows], "sources": [data["sources"][i] for i in rows],
                    "sequences": [sequences[i] for i in rows], "answer_starts": [data["answer_starts"][i] for i in rows],
                    "features": [features[i][:-1].to(torch.bfloat16) for i in rows]}, shard_path(folder, number))
    print(f"{folder}: {len(sequences)} sequences")


if __name__ == "__main__":
    if sys.argv[1] == "save":
        save(Path(sys.argv[2]), Path(sys.argv[3]))
    else:  # restore CARRIED FOLDER [DTYPE [LIMIT]]
        restore(Path(sys.argv[2]), Path(sys.argv[3]), None, *sys.argv[4:5], *map(int, sys.argv[5:6]))
