"""Self-distillation data: the target's own answers to our training prompts.

`python -m training.selfdistill --out build/selfdistill.pt` writes {"prompts", "sequences",
"answer_starts"}: each sequence is the chat-formatted prompt followed by the target's answer,
greedy (default) or sampled (`--temperature`), so a model trained on it learns to predict what
the target would say next. Sampled answers are samples of the target's distribution, so
cross-entropy on them estimates the cross-entropy to that whole distribution.
"""

import argparse
import random
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import StaticCache

from specdemo.models import LoadedModel, default_device, load_model

from .prompts import first_stage_prompts, passage_prompts, passage_requests, without_bench_prompts
from .prompts_varied import varied_first_stage, varied_passage_prompts, varied_passage_requests
from .real_prompts import bench_prompts


def on_default_device() -> torch.device:
    """Make every tensor a trainer creates live on the default device (CUDA when present): one path,
    no `.to(device)` scattered through the training code."""
    device = default_device()
    torch.set_default_device(device)
    return device


def left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [B, W], attention_mask [B, W]): the rows right-aligned, padding on the left."""
    width = max(len(row) for row in rows)
    input_ids = torch.tensor([[pad] * (width - len(row)) + row for row in rows])
    mask = torch.tensor([[0] * (width - len(row)) + [1] * len(row) for row in rows])
    return input_ids, mask


@torch.inference_mode()
def batch_decode(
    target: LoadedModel, prompts_ids: list[list[int]], max_new_tokens: int, temperature: float = 0.0,
    features: bool = False, generator: torch.Generator | None = None,
) -> list[tuple[list[int], torch.Tensor | None]]:
    """The target's answer to each prompt, decoded together: left padding, one attention mask,
    one KV cache for the batch. Greedy (`temperature` 0) or sampled from softmax(logits / T).
    With `features`, also each sequence's feature f_t (the decoder's last hidden state after its
    final norm, what the LM head reads) at every position that predicts a token: [len(prompt) +
    len(answer) - 1, H] in the target's dtype. A row leaves the batch (and the cache) once it
    has ended, so long answers do not make short ones wait. Returns (answer tokens ending with
    EOS unless cut at `max_new_tokens`, features or None) per prompt, in order."""
    model, decoder = target.model, target.model.get_decoder()
    eos = torch.tensor(target.eos_token_ids, device=target.device)
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else target.eos_token_ids[0]
    input_ids, mask = (t.to(target.device) for t in left_padded(prompts_ids, pad))
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # [B, W]: each row counts from its own first token
    cache = StaticCache(config=model.config, max_cache_len=input_ids.shape[1] + max_new_tokens)  # written in place: no copy a step
    hidden = decoder(input_ids=input_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                     use_cache=True).last_hidden_state  # [B, W, H]
    answers: list[list[int]] = [[] for _ in prompts_ids]
    feats = [[hidden[b, hidden.shape[1] - len(ids):]] if features else [] for b, ids in enumerate(prompts_ids)]
    rows = torch.arange(len(prompts_ids))  # which prompt each batch row answers
    last = hidden[:, -1]  # [B, H]
    for step in range(max_new_tokens):
        logits = model.lm_head(last).float()  # [B, V]
        if temperature > 0:
            tokens = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]
        else:
            tokens = logits.argmax(-1)  # [B]
        for row, token in zip(rows.tolist(), tokens.tolist()):
            answers[row].append(token)
        ended = torch.isin(tokens, eos)
        if step == max_new_tokens - 1 or bool(ended.all()):
            break
        if bool(ended.any()):  # drop the finished rows from the batch and the cache
            keep = (~ended).nonzero()[:, 0]
            for layer in cache.layers:
                layer.keys, layer.values = layer.keys[keep], layer.values[keep]
            rows, tokens, mask, positions = rows[keep.cpu()], tokens[keep], mask[keep], positions[keep]
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        positions = positions[:, -1:] + 1
        last = decoder(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions, past_key_values=cache,
                       use_cache=True).last_hidden_state[:, -1]  # [B, H]
        if features:
            for row, state in zip(rows.tolist(), last):
                feats[row].append(state[None])
    return [(answer, torch.cat(f)[: len(ids) + len(answer) - 1].cpu() if features else None)
            for answer, f, ids in zip(answers, feats, prompts_ids)]


def target_answers(
    target: LoadedModel, prompts: list[str], max_new_tokens: int, batch_size: int, temperature: float = 0.0
) -> list[list[int]]:
    """The target's answer tokens to each prompt, in batches of similar prompt length (longest
    first): greedy, or sampled at `temperature` (seeded by the caller's torch.manual_seed)."""
    encoded = [target.encode_chat(prompt)[0].tolist() for prompt in prompts]
    order = sorted(range(len(prompts)), key=lambda i: -len(encoded[i]))
    answers: list[list[int]] = [[] for _ in prompts]
    start = time.time()
    for first in range(0, len(order), batch_size):
        batch = order[first : first + batch_size]
        for index, (answer, _) in zip(batch, batch_decode(target, [encoded[i] for i in batch], max_new_tokens, temperature)):
            answers[index] = answer
        print(f"  {first + len(batch)}/{len(prompts)} answers, {time.time() - start:.0f}s", flush=True)
    return answers


def family_prompts(target: LoadedModel, seed: int, batch_size: int, family: str = "templates") -> tuple[list[str], list[list[int]], list[str]]:
    """A family of our prompts ("templates": prompts.py, "varied": prompts_varied.py):
    (the passage requests, the target's greedy passages, the other prompts with the summaries and
    passage questions built around those passages), no bench prompt among them."""
    bench = bench_prompts()
    requests = varied_passage_requests() if family == "varied" else passage_requests()
    passages = target_answers(target, requests, 200, batch_size)
    passage_text = [target.decode(tokens) for tokens in passages]
    if family == "varied":
        prompts = varied_first_stage(seed) + varied_passage_prompts(passage_text, seed)
    else:
        topics = [request.split("about ")[-1].rstrip(".") for request in requests]
        prompts = first_stage_prompts(seed) + passage_prompts(dict(zip(topics, passage_text)), seed)
    return requests, passages, without_bench_prompts(prompts, bench)


def build(target: LoadedModel, seed: int, max_new_tokens: int, batch_size: int, temperature: float, family: str = "templates") -> dict:
    """The target's answers to a family of our prompts: first the passages it writes, then the
    other prompts and the summaries and passage questions built around those passages."""
    requests, passages, prompts = family_prompts(target, seed, batch_size, family)
    answers = target_answers(target, prompts, max_new_tokens, batch_size, temperature)
    prompts, answers = requests + prompts, passages + answers
    sequences, answer_starts = [], []
    for prompt, answer in zip(prompts, answers):
        prompt_ids = target.encode_chat(prompt)[0].tolist()
        sequences.append(prompt_ids + answer)
        answer_starts.append(len(prompt_ids))
    return {"prompts": prompts, "sequences": sequences, "answer_starts": answer_starts}


def load_data(path: Path, selfdistill_args: list[str]) -> dict:
    """Self-distillation data from `path`, generated first when missing (this module's main)."""
    if not path.exists():
        command = [sys.executable, "-m", "training.selfdistill", "--out", str(path), *selfdistill_args]
        subprocess.run(command, check=True)
    return torch.load(path)


SAMPLED_DATA = Path("build/selfdistill-sampled.pt")
VARIED_DATA = Path("build/selfdistill-varied.pt")
# for the manifests of the models trained on both data sets
SAMPLED_COMMAND = (
    " and the sampled data into `build/selfdistill-sampled.pt`\n"
    "(`python -m training.selfdistill --out build/selfdistill-sampled.pt --seed 1 --temperature 0.8`, about 25 min here)"
)
SAMPLED_DATA_TEXT = (
    ",\nand its answers sampled at temperature {} to a second set of prompts built the same way with another seed\n"
    "(more varied text than the greedy answers alone)"
)
VARIED_COMMAND = (
    " and the varied prompts' data into `build/selfdistill-varied.pt`\n"
    "(`python -m training.selfdistill --prompts varied --out build/selfdistill-varied.pt --seed 2`, about 15 min here)"
)
VARIED_DATA_TEXT = (
    ",\nand its greedy answers to the prompts of `training/prompts_varied.py` (emails, reviews, stories, code to write,\n"
    "explain or fix, word problems, translations both ways, and summaries and questions of passages in several genres)"
)


def optional_path(text: str) -> Path | None:
    """An argparse type: a path, or None for the word 'none'."""
    return None if text == "none" else Path(text)


def load_split(greedy_path: Path, sampled_path: Path | None, temperature: float, held_out: int, seed: int, rng: random.Random,
               varied_path: Path | None = None):
    """The greedy answers, the sampled ones unless `sampled_path` is None, and the greedy answers
    to the varied prompts if `varied_path` is given, with which of them train and which evaluate:
    (data, train_ids, held_out_ids). Held out are whole prompts of the first family, so no answer
    to them (greedy or sampled) is trained on; they are evaluated on their greedy answers, as
    greedy decoding runs."""
    greedy = load_data(greedy_path, ["--seed", str(seed)])
    sampled = load_data(sampled_path, ["--seed", str(seed + 1), "--temperature", str(temperature)]) if sampled_path else {}
    varied = load_data(varied_path, ["--seed", str(seed + 2), "--prompts", "varied"]) if varied_path else {}
    prompts = sorted(set(greedy["prompts"]))
    rng.shuffle(prompts)
    held_out_prompts = set(prompts[:held_out])
    data = {key: greedy[key] + sampled.get(key, []) + varied.get(key, []) for key in ("prompts", "sequences", "answer_starts")}
    held_out_ids = [i for i, prompt in enumerate(greedy["prompts"]) if prompt in held_out_prompts]
    train_ids = [i for i, prompt in enumerate(data["prompts"]) if prompt not in held_out_prompts]
    return data, train_ids, held_out_ids


def length_groups(sequences, indices, tokens_per_batch: int, rng: random.Random | None) -> list[list[int]]:
    """Indices in groups of similar length, about `tokens_per_batch` tokens (padded) each; shuffled by `rng`."""
    order = sorted(indices, key=lambda i: len(sequences[i]))
    groups, group = [], []
    for index in order:
        if group and (len(group) + 1) * len(sequences[index]) > tokens_per_batch:
            groups.append(group)
            group = []
        group.append(index)
    groups.append(group)
    if rng is not None:
        rng.shuffle(groups)
    return groups


def draft_vocabulary(sequences, answer_starts, size: int, always: list[int]) -> torch.Tensor:
    """The `size` token ids most frequent in the answers (plus `always`, e.g. EOS), ascending."""
    counts = torch.zeros(49152, dtype=torch.long)
    for sequence, start in zip(sequences, answer_starts):
        counts += torch.bincount(torch.tensor(sequence[start:]), minlength=49152)
    counts[always] = counts.max() + 1
    return counts.topk(size).indices.sort().values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("build/selfdistill.pt"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy answers; above 0: sampled")
    parser.add_argument("--prompts", choices=["templates", "varied"], default="templates",
                        help="the prompt family: training/prompts.py or training/prompts_varied.py")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    target = load_model("embedded", args.dtype, "cpu")
    data = build(target, args.seed, args.max_new_tokens, args.batch_size, args.temperature, args.prompts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, args.out)
    tokens = sum(len(s) - a for s, a in zip(data["sequences"], data["answer_starts"]))
    print(f"wrote {args.out}: {len(data['sequences'])} sequences, {tokens} answer tokens")


if __name__ == "__main__":
    main()
