"""Build the datastore of earlier answers (`specdemo.methods.retrieval`) from self-distilled shards.

    python -m training.datastore --distill-out build/distill-gpu --out assets/smollm2-135m-answers

It keeps the answer part of every sequence `training.distill` wrote (the target's own greedy
answers; no prompt), in shard order, and writes `answers.npy` and `datastore.json`. Nothing is
trained: the same shards give the same file. Greedy answers only: a sampled answer is a phrase
the target would not have written greedily, a guess verification would refuse.
"""

import argparse
import hashlib
import json
from pathlib import Path

from specdemo.methods.retrieval import Datastore
from specdemo.models import load_model
from training.distill import load_shards


def answers(folder: Path) -> tuple[list[list[int]], dict]:
    """The answers in the shards under `folder` and what the datastore's config says of them."""
    plan = json.loads((folder / "plan.json").read_text())
    if plan.get("temperature", 0.0) != 0.0:
        raise SystemExit(f"{folder} holds sampled answers (temperature {plan['temperature']}): build the datastore from greedy ones")
    data = load_shards(folder, features=False)
    found = [list(map(int, sequence[start:])) for sequence, start in zip(data["sequences"], data["answer_starts"])]
    return found, {"distill_out": str(folder), "distill_dtype": plan.get("dtype"), "max_new_tokens": plan.get("max_new_tokens")}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m training.datastore", description=__doc__.split("\n\n")[0])
    parser.add_argument("--distill-out", type=Path, nargs="+", default=[Path("build/distill")], help="folders of `training.distill` shards")
    parser.add_argument("--out", type=Path, default=Path("assets/smollm2-135m-answers"))
    parser.add_argument("--model", default="embedded", help="the target whose vocabulary the answers use")
    args = parser.parse_args()
    found, about = [], {"sources": []}
    for folder in args.distill_out:
        more, source = answers(folder)
        found += more
        about["sources"].append(source)
    vocab_size = load_model(args.model, "float32").model.config.vocab_size
    store = Datastore.of_answers(found, vocab_size)
    store.save(args.out, about)
    digest = hashlib.sha256((args.out / "answers.npy").read_bytes()).hexdigest()[:16]
    print(f"{store.answers} answers, {len(store.tokens) - store.answers} tokens, vocabulary {vocab_size}: {args.out} (answers.npy sha256 {digest}...)")


if __name__ == "__main__":
    main()
