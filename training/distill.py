"""Batched self-distillation on real prompts, in shards that a killed run resumes from.

    python -m training.distill --prompts ../shared/train/*.jsonl --out build/distill

The target answers the prompts a `SamplingPlan` picks (training/real_prompts.py), in batches of
similar prompt length (`selfdistill.batch_decode`: left padding, one attention mask, one KV cache a
batch), greedy or sampled. Every `--shard-size` prompts make one file `shard-NNNNN.pt` holding
{"prompts", "sources", "sequences", "answer_starts", "features"}: each sequence is the
chat-formatted prompt followed by the answer, and its features are the target's f_t at every
position that predicts a token ([len - 1, H], bfloat16), which the feature draft and the Medusa
heads train on without a second pass of the target. `plan.json` records the plan; a rerun with the
same plan skips the shards already written, and a different plan is refused. `load_shards` reads
them back as one data set.
"""

import argparse
import hashlib
import json
import random
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm import tqdm

from specdemo.models import LoadedModel, default_device, load_model

from .magpie import remake_command
from .real_prompts import SHARED_TRAIN, SamplingPlan, bench_prompts, mixed_in, plan, read_prompts
from .selfdistill import batch_decode, family_prompts

DEFAULT_OUT = Path("build/distill")
DEFAULT_CAPS = (("gsm8k", 2000),)  # GSM8K is one source of 7,473 prompts; T0 is 283 of about 200 each


def machine() -> str:
    """Where a trainer runs, in words, for its manifest: the GPU when there is one, else the cores."""
    if default_device().type == "cuda":
        return f"one {torch.cuda.get_device_name()}"
    return f"{torch.get_num_threads()} CPU cores"


def shard_path(out: Path, number: int) -> Path:
    return out / f"shard-{number:05d}.pt"


def length_batches(lengths: list[int], batch_size: int, batch_tokens: int) -> list[list[int]]:
    """Indices, longest first, in batches of at most `batch_size` rows and, padded to the
    longest prompt plus the answer room, at most about `batch_tokens` tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches = []
    while order:
        rows = max(1, min(batch_size, batch_tokens // lengths[order[0]]))
        batches.append(order[:rows])
        order = order[rows:]
    return batches


def answer_shard(target: LoadedModel, prompts, max_new_tokens: int, batch_size: int, temperature: float,
                 generator: torch.Generator, progress, batch_tokens: int = 16384, known: dict | None = None) -> dict:
    """One shard: the target's answers to `prompts`, batched by prompt length (longest first).
    `known` (see `known_answers`) holds greedy answers already made: a prompt found there with the
    same chat-formatted tokens takes that answer and its features instead of being answered again."""
    encoded = [target.encode_chat(prompt.text)[0].tolist() for prompt in prompts]
    results = [None] * len(prompts)
    for index, (prompt, ids) in enumerate(zip(prompts, encoded)):
        sequence, start, features = (known or {}).get(prompt.text, ((), 0, None))
        if start == len(ids) and list(sequence[:start]) == ids:
            results[index] = (list(sequence[start:]), features)
    todo = [i for i, result in enumerate(results) if result is None]
    if len(todo) < len(prompts):
        progress(len(prompts) - len(todo), 0)
    for batch in length_batches([len(encoded[i]) + max_new_tokens for i in todo], batch_size, batch_tokens):
        batch = [todo[i] for i in batch]
        decoded = batch_decode(target, [encoded[i] for i in batch], max_new_tokens, temperature, features=True, generator=generator)
        for index, result in zip(batch, decoded):
            results[index] = result
        progress(len(batch), sum(len(answer) for answer, _ in decoded))
    return {
        "prompts": [prompt.text for prompt in prompts],
        "sources": [prompt.source for prompt in prompts],
        "sequences": [ids + answer for ids, (answer, _) in zip(encoded, results)],
        "answer_starts": [len(ids) for ids in encoded],
        "features": [features.to(torch.bfloat16) for _, features in results],
    }


def known_answers(folders: list[Path], settings: dict) -> dict:
    """The answers in the shards under `folders`, by prompt text, for a greedy run with `settings`:
    greedy answers are a function of the prompt (batched decoding equals unbatched), so a run with a
    larger plan need not answer again the prompts an earlier run answered with the same settings."""
    if not folders:
        return {}
    if settings["temperature"]:
        raise SystemExit("--reuse: sampled answers depend on their shard's generator; reuse greedy runs only")
    known = {}
    for folder in folders:
        recorded = json.loads((folder / "plan.json").read_text())
        same = {key: recorded.get(key) for key in ("temperature", "max_new_tokens", "dtype")}
        if same != {key: settings.get(key) for key in same}:
            raise SystemExit(f"--reuse {folder}: answered with {same}, not this run's settings")
        data = load_shards(folder)
        known.update({text: row for text, *row in zip(data["prompts"], data["sequences"], data["answer_starts"], data["features"])})
    return known


def run(target: LoadedModel, prompts, out: Path, settings: dict, shard_size: int, batch_size: int, batch_tokens: int = 16384,
        reuse: list[Path] = ()) -> None:
    """Answer `prompts` into shards under `out`, skipping the shards already there and taking the
    answers of the shards under `reuse` (`known_answers`) for the prompts they hold."""
    out.mkdir(parents=True, exist_ok=True)
    recorded = out / "plan.json"
    record = {**settings, "prompts": len(prompts), "shard_size": shard_size}
    if recorded.exists() and json.loads(recorded.read_text()) != record:
        raise SystemExit(f"{out} holds shards of another plan ({recorded}): choose another --out or delete it")
    recorded.write_text(json.dumps(record, indent=2) + "\n")
    shards = range((len(prompts) + shard_size - 1) // shard_size)
    todo = [n for n in shards if not shard_path(out, n).exists()]
    done_prompts = len(prompts) - sum(len(prompts[n * shard_size : (n + 1) * shard_size]) for n in todo)
    bar = tqdm(total=len(prompts), initial=done_prompts, unit="answer", smoothing=0.05)
    known = known_answers(list(reuse), settings)
    clock, tokens = time.time(), 0

    def progress(answers: int, new_tokens: int) -> None:
        nonlocal tokens
        tokens += new_tokens
        bar.set_postfix_str(f"{tokens / (time.time() - clock):.0f} tokens/s")
        bar.update(answers)

    for number in todo:
        generator = torch.Generator().manual_seed(settings["seed"] * 100_003 + number)  # a resumed shard samples as a fresh one
        shard = answer_shard(target, prompts[number * shard_size : (number + 1) * shard_size], settings["max_new_tokens"],
                             batch_size, settings["temperature"], generator, progress, batch_tokens=batch_tokens, known=known)
        partial = shard_path(out, number).with_suffix(".tmp")
        torch.save(shard, partial)
        partial.rename(shard_path(out, number))  # a killed run never leaves half a shard
    bar.close()


def load_shards(out: Path, features: bool = True) -> dict:
    """Every shard under `out` as one data set (the keys of a shard, lists concatenated)."""
    paths = sorted(out.glob("shard-*.pt"))
    if not paths:
        raise SystemExit(f"no shards in {out}: run `python -m training.distill --out {out}` first")
    data: dict[str, list] = {}
    for path in paths:
        shard = torch.load(path)
        if not features:
            shard.pop("features")
        for key, values in shard.items():
            data.setdefault(key, []).extend(values)
    return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The prompt files and the sampling plan, shared by every trainer that reads real prompts."""
    parser.add_argument("--prompts", type=Path, nargs="+", default=None,
                        help=f"JSONL files with a 'prompt' field (e.g. {SHARED_TRAIN}/*.jsonl); without it, our own templates")
    parser.add_argument("--cap-per-source", type=int, default=30, help="at most this many prompts of one source")
    parser.add_argument("--cap", nargs="*", default=[f"{p}={c}" for p, c in DEFAULT_CAPS], metavar="PREFIX=N",
                        help="the cap for the sources under a prefix instead")
    parser.add_argument("--max-chars", type=int, default=1500, help="leave out longer prompts")
    parser.add_argument("--limit", type=int, default=None, help="at most this many prompts in all")
    parser.add_argument("--plan-seed", type=int, default=0)
    parser.add_argument("--templates", action="store_true",
                        help="answer our template prompts (training/prompts.py) too, mixed in: the long chat answers real prompts lack")


def own_files(paths: list[Path]) -> dict:
    """The prompt files from outside ../shared/train (e.g. `training.magpie`'s), by path, for the
    recorded command; nothing when there are none, so plans of the shared files alone record as before."""
    own = [str(path) for path in paths if path.resolve().parent != SHARED_TRAIN.resolve()]
    return {"own_files": own} if own else {}


def sampling_plan(args) -> SamplingPlan:
    caps = tuple((item.split("=")[0], int(item.split("=")[1])) for item in args.cap)
    return SamplingPlan(args.cap_per_source, caps, args.max_chars, args.limit, args.plan_seed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--seed", type=int, default=0, help="of the sampled answers")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy answers; above 0: sampled")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--shard-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--batch-tokens", type=int, default=16384, help="at most this many tokens (prompt and answer room) a batch; more on a GPU")
    parser.add_argument("--dtype", default="float32", help="float32 prefills faster than bfloat16 on an AVX-512 CPU without AMX")
    parser.add_argument("--reuse", type=Path, nargs="*", default=[],
                        help="folders of earlier greedy runs with the same settings: their answers are taken, not made again")
    args = parser.parse_args()
    if not args.prompts:
        parser.error("--prompts: give the JSONL files to answer")
    sampling = sampling_plan(args)
    prompts = plan(read_prompts(args.prompts), sampling, bench_prompts())
    settings = {"plan": {**vars(sampling), "caps": [list(c) for c in sampling.caps]},
                "files": sorted(p.name for p in args.prompts), **own_files(args.prompts), "seed": args.seed, "temperature": args.temperature,
                "max_new_tokens": args.max_new_tokens, "dtype": args.dtype, "templates": args.templates}
    target = load_model("embedded", args.dtype)
    if args.templates:
        requests, _, others = family_prompts(target, args.plan_seed, batch_size=32)
        prompts = mixed_in(prompts, requests + others, "templates", args.plan_seed)
    print(f"{len(prompts)} prompts from {len(args.prompts)} files{' and our templates' if args.templates else ''}", flush=True)
    run(target, prompts, args.out, settings, args.shard_size, args.batch_size, args.batch_tokens, reuse=args.reuse)


if __name__ == "__main__":
    main()


Trained = frozenset[str] | Callable[[dict], frozenset[str]]


def load_split(out: Path, held_out: int, seed: int, trained: Trained = frozenset()) -> tuple[dict, list[int], list[int]]:
    """The shards under `out` with `held_out` whole prompts (`held_out_ids`) set aside for
    evaluation: (data, train_ids, held_out_ids); data["features"][i] is [len(sequence), H], its
    last row zero (no position after the last token is ever predicted from). `trained`: prompts
    never to hold out, or a function of the shards' data that names them (`trained_by`)."""
    data = load_shards(out)
    data["features"] = [torch.cat([f, f.new_zeros(1, f.shape[-1])]) for f in data["features"]]
    held = held_out_ids(data["prompts"], held_out, seed, trained(data) if callable(trained) else trained)
    return data, sorted(set(range(len(data["prompts"]))) - set(held)), held


def held_out_ids(prompts: list[str], held_out: int, seed: int, trained: frozenset[str] = frozenset()) -> list[int]:
    """`held_out` whole prompts chosen by `seed`, none of them in `trained`: the prompts an earlier
    model trained on, when a run fine-tunes it (so the held-out numbers stay on unseen prompts)."""
    ids = list(range(len(prompts)))
    random.Random(seed).shuffle(ids)
    return sorted([i for i in ids if prompts[i] not in trained][:held_out])


def trained_on(out: Path, held_out: int, seed: int, answers: int | None = None) -> frozenset[str]:
    """The prompts a trainer run on the shards under `out` trained on: all but its held-out ones.
    `answers`: how many answers the shards held when it ran, where the folder has grown since (a
    later run of the same plan with a larger `--limit` appends, so they are the first ones)."""
    prompts = load_shards(out, features=False)["prompts"][:answers]
    held = set(held_out_ids(prompts, held_out, seed))
    return frozenset(text for i, text in enumerate(prompts) if i not in held)


def trained_by(folder: Path, data: dict | None = None) -> frozenset[str]:
    """The prompts the asset in `folder` trained on (`trained_on` the shards its training report names):
    a run that fine-tunes it (`--start-from`) holds none of them out. Where those shards are gone,
    its plan's real prompts, drawn again from the recorded files and plan (the draw is seeded), and,
    when it answered our templates too, every template prompt of `data`, the shards of this run
    (their texts come from the target's own passages, too costly to remake here): none of them is
    held out either, so the held-out prompts stay unseen whichever they are. Where the report names
    what it trained on (`trained_prompts`, `chain_digests`), exactly the prompts of `data` it names:
    what the asset trained on and what its start, and that one's, did, however long the chain of
    fine-tunes (the shards alone give only the asset's own split, redrawn)."""
    report = json.loads((folder / "training_report.json").read_text())
    if data is not None and "trained_prompts" in report:
        chain = set(report["trained_prompts"])
        return frozenset(text for text in data["prompts"] if prompt_digest(text) in chain)
    recorded = report["args"]
    shards = Path(recorded["distill_out"])
    if any(shards.glob("shard-*.pt")):
        # its split redrawn over the answers it saw, however many were added since; a run that trained on only some
        # of its split's training answers (`--train-limit`) counted fewer than it saw: all of them count as trained
        limited = recorded.get("train_limit", "None") != "None"
        answers = None if limited else report.get("train_sequences", 0) + report.get("held_out_sequences", 0)
        return trained_on(shards, int(recorded["held_out"]), int(recorded["seed"]), answers or None)
    files = [Path(path) for path in re.findall(r"PosixPath\('([^']+)'\)", recorded["prompts"])]
    caps = tuple((item.split("=")[0], int(item.split("=")[1])) for item in re.findall(r"'([^']+=\d+)'", recorded["cap"]))
    limit = None if recorded["limit"] == "None" else int(recorded["limit"])
    sampling = SamplingPlan(int(recorded["cap_per_source"]), caps, int(recorded["max_chars"]), limit, int(recorded["plan_seed"]))
    texts = {prompt.text for prompt in plan(read_prompts(files), sampling, bench_prompts())}
    if recorded["templates"] == "True" and data is not None:
        texts |= {text for text, source in zip(data["prompts"], data["sources"]) if source == "templates"}
    return frozenset(texts)


def prompt_digest(text: str) -> str:
    """A prompt's name in a training report: the first 16 hex digits of its SHA-256 (the reports
    name the prompts an asset trained on without copying the shared prompts into the project)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def chain_digests(trained: list[str], start: Path | None = None) -> list[str]:
    """What a training report records as `trained_prompts`: the digests of the prompts it `trained`
    on and of those its `start` (a fine-tune's `--start-from`) recorded, sorted, so that a fine-tune
    of a fine-tune still holds out none of what any earlier link trained on (`trained_by`)."""
    earlier = json.loads((start / "training_report.json").read_text()).get("trained_prompts", []) if start else []
    return sorted({*earlier, *map(prompt_digest, trained)})


def start_manifest(folder: Path) -> str:
    """What a fine-tune keeps as its MANIFEST-start.md: the manifest of the asset in `folder` it
    started from, and that asset's own MANIFEST-start.md after it when it too was a fine-tune, so
    that a chain of fine-tunes keeps every command back to the first training from scratch."""
    text = (folder / "MANIFEST.md").read_text()
    earlier = folder / "MANIFEST-start.md"
    if earlier.exists():
        text += f"\n---\n\n*The asset above was itself fine-tuned; what it started from:*\n\n{earlier.read_text()}"
    return text


def ensure_split(args, out: Path, held_out: int, seed: int, trained: Trained = frozenset()) -> tuple[dict, list[int], list[int]]:
    """`load_split`, answering the prompts of `args` (a trainer's `add_arguments`) into `out` first
    when it holds no shard yet (`python -m training.distill` resumes an unfinished run)."""
    if not any(out.glob("shard-*.pt")):
        plan_args = ["--cap-per-source", str(args.cap_per_source), "--cap", *args.cap, "--max-chars", str(args.max_chars),
                     "--plan-seed", str(args.plan_seed), *(["--limit", str(args.limit)] if args.limit else []),
                     *(["--templates"] if args.templates else [])]
        command = [sys.executable, "-m", "training.distill", "--prompts", *map(str, args.prompts), "--out", str(out), *plan_args]
        subprocess.run(command, check=True)
    return load_split(out, held_out, seed, trained)


def describe(out: Path, data: dict, train_ids: list[int]) -> str:
    """The data paragraph of a MANIFEST.md for an asset trained on the shards under `out`."""
    recorded = json.loads((out / "plan.json").read_text())
    sources: dict[str, int] = {}
    for i in train_ids:
        family = data["sources"][i].split("/")[0]
        sources[family] = sources.get(family, 0) + 1
    mix = ", ".join(f"{family} {count}" for family, count in sorted(sources.items(), key=lambda item: -item[1]))
    plan_ = recorded["plan"]
    caps = ", ".join(f"{prefix} {cap}" for prefix, cap in plan_["caps"])
    positions = sum(len(data["sequences"][i]) - data["answer_starts"][i] for i in train_ids)
    kind = "greedy" if recorded["temperature"] == 0 else f"sampled at temperature {recorded['temperature']}"
    return (
        f"Self-distillation on real prompts: the target's own {kind} answers ({recorded['dtype']}, at most "
        f"{recorded['max_new_tokens']} new tokens; `python -m training.distill`) to {len(data['prompts'])} of the "
        f"{recorded['prompts']} prompts its plan drew from `{', '.join(recorded['files'])}` (docs/training.md says where they "
        f"come from){' and our template prompts (`training/prompts.py`)' if recorded.get('templates') else ''}: at most {plan_['cap_per_source']} a source ({caps} instead), at most {plan_['max_chars']} characters, seed "
        f"{plan_['seed']}, none sharing a run of 10 words with a bench prompt (ours or Spec-Bench's). Training answers by family: "
        f"{mix}; {positions} answer positions."
    )


def command(out: Path, data: dict) -> str:
    """The `training.distill` command that makes the shards `data` came from (with the plan's own
    `--limit`, or one when a run was stopped after fewer shards than its plan: the plan's first
    prompts are the same)."""
    recorded = json.loads((out / "plan.json").read_text())
    plan_, defaults = recorded["plan"], SamplingPlan()
    words = []
    if plan_["cap_per_source"] != defaults.cap_per_source:
        words += ["--cap-per-source", str(plan_["cap_per_source"])]
    if [tuple(c) for c in plan_["caps"]] != list(DEFAULT_CAPS):
        words += ["--cap", *(f"{prefix}={cap}" for prefix, cap in plan_["caps"])]
    if plan_["max_chars"] != 1500:
        words += ["--max-chars", str(plan_["max_chars"])]
    if plan_["seed"] != defaults.seed:
        words += ["--plan-seed", str(plan_["seed"])]
    if len(data["prompts"]) < recorded["prompts"]:
        words += ["--limit", str(len(data["prompts"]))]
    elif plan_["limit"] is not None:
        words += ["--limit", str(plan_["limit"])]
    if recorded.get("templates"):
        words += ["--templates"]
    if recorded["max_new_tokens"] != 128:
        words += ["--max-new-tokens", str(recorded["max_new_tokens"])]
    if recorded["temperature"]:
        words += ["--temperature", str(recorded["temperature"]), "--seed", str(recorded["seed"])]
    if out != DEFAULT_OUT:  # the trainers' --distill-out reads it there
        words += ["--out", str(out)]
    own = recorded.get("own_files", [])
    answers = " ".join([".venv/bin/python -m training.distill --prompts ../shared/train/*.jsonl", *own, *words])
    return "\n    ".join([*filter(None, map(remake_command, own)), answers])
