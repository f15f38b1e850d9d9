"""Chat prompts written by the target itself (Magpie), for self-distillation in Spec-Bench's style.

    python -m training.magpie --count 2000 --out build/magpie.jsonl

Magpie (Xu et al. 2024, "Magpie: Alignment Data Synthesis from Scratch by Prompting Aligned LLMs
with Nothing"): give an instruction-tuned model its chat template up to where a user's words
begin, and it writes a user's request, the kind it was tuned to answer. Our real prompts
(`../shared/train`) are mostly T0's NLP tasks and GSM8K's problems, whose answers are short or
formulaic; Spec-Bench asks chat questions (write, explain, plan, role-play), and a draft learns
the target's answers to those only from prompts like them. These prompts cost no data and copy
nothing: each is the target's own sample.

Every batch samples `batch_size` requests from the same prefix, seeded by (`seed`, batch number),
and keeps those that closed their turn within `max_new_tokens` and hold at least `MIN_WORDS`
words, once each. The JSONL grows a batch at a time ({"prompt", "source", "batch", "batch_size"}): a killed run
resumes after its last batch, and the same seed and batch size write the same file on the same kind of device
(a GPU samples other numbers than a CPU). `training.distill --prompts`
reads it as any prompt file (its plan leaves out whatever nearly copies a bench prompt).
"""

import argparse
import json
from pathlib import Path

import torch
from tqdm import tqdm

from specdemo.models import LoadedModel, load_model

from .selfdistill import on_default_device

DEFAULT_OUT = Path("build/magpie.jsonl")
MIN_WORDS = 4
DEFAULT_BATCH_SIZE = 64
SOURCE = "written_by_target"  # sorts after the shared files' sources ("gsm8k", "self_instruct", "t0/..."), so that adding these
# prompts to a plan leaves the sample `plan` draws from those unchanged (it shuffles source after source with one generator)
MARK = "\x00MAGPIE\x00"


def user_turn(target: LoadedModel) -> tuple[list[int], int]:
    """The chat template's tokens up to where a user's words begin, and the token that ends a turn."""
    text = target.tokenizer.decode(target.encode_chat(MARK)[0])
    before, after = text.split(MARK)
    prefix = target.tokenizer.encode(before, add_special_tokens=False)
    end = target.tokenizer.encode(after, add_special_tokens=False)[0]
    return prefix, end


def sample_requests(target: LoadedModel, batch: int, size: int, seed: int, max_new_tokens: int, temperature: float, top_p: float) -> list[str]:
    """Batch number `batch`: `size` sampled user requests, those that ended their turn, stripped."""
    prefix, end = user_turn(target)
    ids = torch.tensor([prefix] * size, device=target.device)
    generator_seed = seed * 1_000_003 + batch
    torch.manual_seed(generator_seed)  # transformers' sampling draws from the global generator
    with torch.inference_mode():
        out = target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=temperature, top_p=top_p, top_k=0,
                                    max_new_tokens=max_new_tokens, eos_token_id=end, pad_token_id=end)
    requests = []
    for row in out[:, len(prefix):].tolist():
        if end not in row:  # ran out of room mid-request
            continue
        text = target.tokenizer.decode(row[: row.index(end)], skip_special_tokens=True).strip()
        if len(text.split()) >= MIN_WORDS:
            requests.append(text)
    return requests


def source(model: str) -> str:
    """The source name of the prompts `model` wrote (a plan caps them by the prefix `SOURCE`)."""
    return f"{SOURCE}/magpie-{model}"


def remake_command(path: str) -> str | None:
    """The command that writes the prompt file at `path` again when this module wrote it (its rows
    name their source; the run stops after the batch that reaches the count: the same file), so a
    manifest's commands (`distill.command`) remake it first; None for any other file."""
    file = Path(path)
    if not file.exists():
        return None
    rows = [json.loads(line) for line in file.read_text().splitlines() if line.strip()]
    model = rows[0].get("source", "").removeprefix(source("")) if rows else ""
    if not rows or rows[0].get("source") != source(model) or not model:
        return None
    size = rows[0].get("batch_size", DEFAULT_BATCH_SIZE)  # files written before it was recorded used the default
    return " ".join([".venv/bin/python -m training.magpie", *(["--model", model] if model != "embedded" else []), "--count", str(len(rows)),
                     *(["--batch-size", str(size)] if size != DEFAULT_BATCH_SIZE else []), "--out", path])


def written(out: Path) -> tuple[list[str], int]:
    """The prompts already in `out` and the next batch number."""
    if not out.exists():
        return [], 0
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return [record["prompt"] for record in records], 1 + max((record["batch"] for record in records), default=-1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="embedded")
    parser.add_argument("--count", type=int, default=2000, help="stop once the file holds this many prompts")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="requests sampled a batch (seeded by its number); more on a GPU")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="a request longer than this is dropped")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--dtype", default="float32")
    args = parser.parse_args(argv)
    on_default_device()
    target = load_model(args.model, args.dtype)
    prompts, batch = written(args.out)
    seen = set(prompts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with tqdm(total=args.count, initial=min(len(seen), args.count), unit="prompt") as bar, args.out.open("a") as file:
        while len(seen) < args.count:
            new = [text for text in dict.fromkeys(sample_requests(target, batch, args.batch_size, args.seed, args.max_new_tokens, args.temperature, args.top_p))
                   if text not in seen]
            for text in new:
                file.write(json.dumps({"prompt": text, "source": source(args.model), "batch": batch, "batch_size": args.batch_size}) + "\n")
            file.flush()
            seen.update(new)
            bar.update(min(len(new), args.count - bar.n))
            batch += 1


if __name__ == "__main__":
    main()
