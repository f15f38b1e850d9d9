"""Jacobi trajectories of the embedded target on our training prompts: CLLM's training data.

    python -m training.jacobi_trajectories     # build/jacobi_trajectories.pt (train_cllm runs it when missing)
    python -m training.jacobi_trajectories --prompts ../shared/train/*.jsonl --templates --distill-out build/distill-mix

For each answer the target wrote greedily (training/selfdistill.py's answers to our template
prompts, or with `--prompts` the shards of `training.distill` for real prompts and a sampling
plan; never the bench's), every block of `block_size` answer tokens is Jacobi-decoded after its true prefix,
from the first guess `specdemo.methods.jacobi` makes (the last committed token repeated) to its fixed
point, and each state on the way is stored (Kou et al. 2024, "CLLMs", Sec. 3.1: the
trajectory collection; Algorithm 1). All blocks of one answer iterate together in one pass
each: a block's tokens see the prompt, the answer before the block, and the block's earlier
tokens (`block_states_mask`), which is exactly what a Jacobi pass over that block alone sees;
`--batch-size` iterates several answers together, left-padded into one cache (`batch_trajectories`:
a GPU waits on kernel launches when it gets one answer a pass).
"""

import argparse
import json
import random
import time
from pathlib import Path

import torch
from transformers import DynamicCache

from specdemo.core.attention import additive
from specdemo.core.kvcache import keep_prefix
from specdemo.models import load_model

from . import distill, selfdistill
from .selfdistill import left_padded, load_split

BLOCK_SIZE = 16  # specdemo.methods.jacobi's default block


def block_starts(answer_length: int, block_size: int, offset: int) -> list[int]:
    """Answer offsets where blocks begin: 0 (where decoding starts its first block), then offset,
    offset + block_size, ... (a random offset in [0, block_size) varies where boundaries fall,
    as they vary at decoding time; the first block may overlap the second, each sees its own
    true prefix)."""
    starts = [0] + list(range(offset or block_size, answer_length, block_size))
    return [s for s in starts if s < answer_length]


def block_states_mask(context_ends: list[int], lengths: list[int], context_length: int) -> torch.Tensor:
    """`allowed` [q, context_length + q] (bool) for blocks of new tokens fed after a context of
    `context_length` tokens: block j (its `lengths[j]` tokens, concatenated in order) sees the
    first `context_ends[j]` context tokens and, causally, its own tokens."""
    q = sum(lengths)
    allowed = torch.zeros(q, context_length + q, dtype=torch.bool)
    row = 0
    for end, length in zip(context_ends, lengths):
        allowed[row : row + length, :end] = True
        allowed[row : row + length, context_length + row : context_length + row + length] = torch.ones(length, length, dtype=torch.bool).tril()
        row += length
    return allowed


def block_positions(context_ends: list[int], lengths: list[int]) -> torch.Tensor:
    """Position ids [1, q]: block j's token i sits at context_ends[j] + i."""
    return torch.cat([torch.arange(end, end + length) for end, length in zip(context_ends, lengths)])[None]


def trajectories(model, sequence: list[int], answer_start: int, starts: list[int], block_size: int) -> list[list[list[int]]]:
    """For each block starting at answer offset `starts[j]`: its Jacobi states, first guess to
    fixed point (the last state repeats no earlier one; at most block_size + 1 states)."""
    return batch_trajectories(model, [(sequence, answer_start, starts)], block_size)[0]


@torch.inference_mode()
def batch_trajectories(model, answers: list[tuple[list[int], int, list[int]]], block_size: int) -> list[list[list[list[int]]]]:
    """`trajectories` of several answers ((sequence, answer start, block starts) each) in one pass
    an iteration: the sequences left-padded into one cache, and each row's active blocks fed after
    it, padded to the longest row's (a padding query sees only itself, and no real one sees padding).
    Positions are each sequence's own. A row stays in the batch until every row has converged."""
    decoder, head = model.get_decoder(), model.get_output_embeddings()
    sequences = [sequence for sequence, _, _ in answers]
    input_ids, padding = left_padded(sequences, pad=0)
    width = input_ids.shape[1]
    shift = [width - len(sequence) for sequence in sequences]  # where each sequence begins in the cache
    cache = DynamicCache(config=model.config)
    hidden = decoder(input_ids=input_ids, attention_mask=padding, position_ids=(padding.cumsum(-1) - 1).clamp(min=0),
                     past_key_values=cache, use_cache=True).last_hidden_state
    ends = [[answer_start + s for s in starts] for _, answer_start, starts in answers]
    lengths = [[min(block_size, len(sequence) - end) for end in row] for sequence, row in zip(sequences, ends)]
    rows = torch.tensor([b for b, row in enumerate(ends) for _ in row], dtype=torch.long)
    columns = torch.tensor([shift[b] + end - 1 for b, row in enumerate(ends) for end in row], dtype=torch.long)
    firsts = iter(head(hidden[rows, columns]).argmax(-1).tolist())
    first_tokens = [[next(firsts) for _ in row] for row in ends]  # fixed: the prefix never changes
    states = [[[[sequence[end - 1]] * length] for end, length in zip(row, row_lengths)]
              for sequence, row, row_lengths in zip(sequences, ends, lengths)]
    active = [list(range(len(row))) for row in ends]
    while any(active):
        fed = [[states[b][j][-1] for j in active[b]] for b in range(len(answers))]
        width_fed = max(sum(map(len, row)) for row in fed)
        allowed = torch.zeros(len(answers), width_fed, width + width_fed, dtype=torch.bool)
        allowed[:, range(width_fed), range(width, width + width_fed)] = True  # padding queries: themselves
        tokens = torch.zeros(len(answers), width_fed, dtype=torch.long)
        positions = torch.zeros(len(answers), width_fed, dtype=torch.long)
        for b, row in enumerate(fed):
            q = sum(map(len, row))
            if not q:
                continue
            row_ends, row_lengths = [ends[b][j] for j in active[b]], [lengths[b][j] for j in active[b]]
            sees = block_states_mask(row_ends, row_lengths, len(sequences[b]))  # [q, len + q]
            allowed[b, :q, shift[b] : width] = sees[:, : len(sequences[b])]
            allowed[b, :q, width : width + q] = sees[:, len(sequences[b]) :]
            tokens[b, :q] = torch.tensor(sum(row, []))
            positions[b, :q] = block_positions(row_ends, row_lengths)[0]
        hidden = decoder(input_ids=tokens, attention_mask=additive(allowed, model.dtype)[0, 0][:, None], position_ids=positions,
                         past_key_values=cache, use_cache=True).last_hidden_state
        keep_prefix(cache, width)
        choices = head(hidden).argmax(-1).tolist()  # [B][width_fed]
        for b, row in enumerate(fed):
            still_active, column = [], 0
            for j, state in zip(active[b], row):
                updated = [first_tokens[b][j], *choices[b][column : column + len(state) - 1]]  # Jacobi update of every position
                column += len(state)
                if updated != state and len(states[b][j]) <= block_size:
                    states[b][j].append(updated)
                    still_active.append(j)
            active[b] = still_active
    return states


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    distill.add_arguments(parser)
    parser.add_argument("--distill-out", type=Path, default=distill.DEFAULT_OUT, help="the shards of `training.distill` for --prompts")
    parser.add_argument("--data", type=Path, default=Path("build/selfdistill.pt"), help="greedy answers to our templates (made when missing), without --prompts")
    parser.add_argument("--min-answer", type=int, default=1, help="only answers of at least this many tokens (a few-word answer holds no full block)")
    parser.add_argument("--out", type=Path, default=Path("build/jacobi_trajectories.pt"))
    parser.add_argument("--block-size", type=int, default=BLOCK_SIZE)
    parser.add_argument("--held-out", type=int, default=80, help="prompts kept out (the same split as the Medusa heads')")
    parser.add_argument("--answers", type=int, default=360, help="only the first N training answers, shuffled (360: about 17 min here)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default=None, help="as the answers were written (the shards' plan.json says; our templates' in bfloat16)")
    parser.add_argument("--minutes", type=float, default=None, help="stop collecting after this long and keep the answers done")
    parser.add_argument("--part", default=None, metavar="K/N", help="only every N-th answer from the K-th (0-based): N processes side by side")
    parser.add_argument("--batch-size", type=int, default=1, help="answers iterated together, one pass an iteration (more on a GPU)")
    parser.add_argument("--merge", type=Path, nargs="+", default=None, help="join these parts' files (same other flags) into --out")
    args = parser.parse_args()
    selfdistill.on_default_device()
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    if args.prompts:  # the same split as the draft's and the heads' trained on these shards
        data, train_ids, held_out_ids = distill.ensure_split(args, args.distill_out, args.held_out, args.seed)
    else:
        data, train_ids, held_out_ids = load_split(args.data, None, 0.0, args.held_out, args.seed, rng)
    train_ids = [i for i in train_ids if len(data["sequences"][i]) - data["answer_starts"][i] >= args.min_answer]
    rng.shuffle(train_ids)
    train_ids = train_ids[: args.answers]
    offsets = [rng.randrange(args.block_size) for _ in train_ids]  # where each answer's blocks fall, drawn for all parts alike
    if args.merge:
        records = [record for path in args.merge for record in torch.load(path)["records"]]
    else:
        part, parts = map(int, args.part.split("/")) if args.part else (0, 1)
        dtype = args.dtype or (json.loads((args.distill_out / "plan.json").read_text())["dtype"] if args.prompts else "bfloat16")
        records = collect(load_model("embedded", dtype).model, data, list(zip(train_ids, offsets))[part::parts], args.block_size, args.minutes,
                          args.batch_size)
    if args.prompts:
        collected = [record["id"] for record in records]
        origin = {"data_text": distill.describe(args.distill_out, data, collected), "distill_command": distill.command(args.distill_out, data)}
    else:
        origin = {"data_text": ("Self-distillation on our templates: the target's own greedy answers to the prompts "
                                "`training/prompts.py` builds from our templates and word lists (`build/selfdistill.pt`).")}
    converged = sum(r["states"][j][-1] == r["sequence"][r["answer_start"] + s : r["answer_start"] + s + len(r["states"][j][-1])]
                    for r in records for j, s in enumerate(r["block_starts"]))
    blocks = sum(len(r["block_starts"]) for r in records)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    held_out_prompts = [data["prompts"][i] for i in held_out_ids]
    torch.save({"records": records, "held_out_prompts": held_out_prompts, "block_size": args.block_size, "seed": args.seed,
                "min_answer": args.min_answer, **origin}, args.out)
    print(f"wrote {args.out}: {len(records)} answers, {blocks} blocks, {converged / blocks:.3f} of them converged to the "
          f"greedy answer, {sum(len(s) - 1 for r in records for s in r['states']) / blocks:.2f} Jacobi passes a block")


def collect(model, data: dict, answers: list[tuple[int, int]], block_size: int, minutes: float | None,
            batch_size: int = 1) -> list[dict]:
    """The trajectory records of `answers` ((answer id, block offset) pairs, in order), `batch_size`
    answers a pass (`batch_trajectories`), stopping once `minutes` are spent (the answers done by then)."""
    records, start = [], time.time()
    for first in range(0, len(answers), batch_size):
        batch = []
        for i, offset in answers[first : first + batch_size]:
            sequence, answer_start = data["sequences"][i], data["answer_starts"][i]
            batch.append((i, sequence, answer_start, block_starts(len(sequence) - answer_start, block_size, offset)))
        states = batch_trajectories(model, [(sequence, answer_start, starts) for _, sequence, answer_start, starts in batch], block_size)
        records += [{"id": i, "sequence": sequence, "answer_start": answer_start, "block_starts": starts, "states": row}
                    for (i, sequence, answer_start, starts), row in zip(batch, states)]
        if first // batch_size % max(1, 50 // batch_size) == 0:
            print(f"  {len(records)}/{len(answers)} answers, {time.time() - start:.0f}s", flush=True)
        if minutes and time.time() - start > 60 * minutes:
            print(f"  the {minutes:g} minutes are spent: {len(records)} answers", flush=True)
            break
    return records


if __name__ == "__main__":
    main()
