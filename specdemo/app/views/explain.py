"""The page's words: what a step did, why an answer differs from AR's, how a method works, the CLLM's quality check."""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from specdemo.core.events import StepEvent
from specdemo.core.steps import BeamStep, ChainStep, ContrastiveStep, JacobiStep, LookaheadStep, SamplingCheck, TreeStep


def explain_step(event: StepEvent, decode: Callable[[int], str]) -> str:
    """One or two sentences that say what a step did, for the step-through mode: the sentence of
    its payload's kind (EXPLAIN), after what every step shares."""
    quoted = lambda tokens: " ".join(repr(decode(t)) for t in tokens)  # noqa: E731
    committed = len(event.committed)
    # nothing of its own where the answer ended on an accepted token (its length, or an end token)
    own = quoted(event.committed[len(event.accepted) :]) or "nothing more (the answer ended there)"
    said = Said(quoted, own, f"{counted(committed, 'token', 'tokens')} committed in one target pass.")
    return f"Step {event.step + 1}: " + EXPLAIN.get(type(event.data), explain_one_token)(event, said, decode)


@dataclass(frozen=True)
class Said:
    """What every step's sentence may quote."""

    quoted: Callable  # token ids -> their quoted texts
    own: str  # the target's own tokens, quoted
    done: str  # "n tokens committed in one target pass."


def explain_one_token(event: StepEvent, said: Said, decode) -> str:
    return f"the target's next token is {said.own}: one token a pass, the baseline."


def explain_chain(event: StepEvent, said: Said, decode) -> str:
    if not event.proposed and event.data.proposer == "heads":
        return (f"the prompt pass gave the target's first token {said.own}; the heads read its last hidden state to "
                "guess the tokens after it.")
    if not event.proposed:  # a feature draft's first pass, or no room left to draft
        why = ("the draft drafts from the target's features, which this first pass computes" if event.step == 0
               else "the answer's last token leaves no room for a draft")
        return f"nothing was drafted this pass ({why}), so the target gave {said.own}, as AR would. {said.done}"
    proposed, accepted = len(event.proposed), len(event.accepted)
    if accepted == proposed:
        verdict = f"the target accepted all {proposed} and added {said.own} of its own"
    else:
        verdict = (f"the target agreed with the first {accepted}; it replaced the {ordinal(accepted + 1)} "
                   f"({said.quoted(event.rejected[:1])}) with {said.own}")
    return (f"the draft proposed {counted(proposed, 'token', 'tokens')} ({said.quoted(event.proposed)}); {verdict}. "
            f"{said.done}")


def explain_tree(event: StepEvent, said: Said, decode) -> str:
    data, accepted = event.data, len(event.accepted)
    grown, taken = copied_clauses(data)
    tokens = f"{counted(accepted, 'token', 'tokens')} ({said.quoted(event.accepted)})"
    if data.proposer == "heads":
        chosen = " (the paths they were surest of at this step)" if data.tree_kind == "dynamic" else ""
        agreed = (f"the deepest path the target agreed with has {tokens}{taken}" if accepted
                  else "the target agreed with none of its paths")
        heads = counted(data.tree.sources.count("head"), "candidate token", "candidate tokens")
        return (f"the heads proposed a tree of {heads}{chosen}{grown}, checked in one pass with tree attention; "
                f"{agreed}, then the target added {said.own}. {said.done}")
    followed = f"followed one for {tokens}{taken}" if accepted else "agreed with none of them"
    return (
        f"the draft grew a tree of {counted(data.tree.sources.count('draft'), 'token', 'tokens')}, keeping the "
        f"branches it found likeliest{grown}, {data.gamma} deep in all; the target checked every branch in one pass "
        f"and {followed}, then added {said.own}. {said.done}"
    )


def explain_jacobi(event: StepEvent, said: Said, decode) -> str:
    right = len(event.accepted)
    one = right == 1
    final = (f"none was yet what the target predicts, so the target's own token ({said.own}) alone is final"
             if not right else
             f"the first{'' if one else f' {right}'} {'was' if one else 'were'} already what the target predicts, "
             f"so {'it is' if one else 'they are'} final, and the target's token after {'it' if one else 'them'} "
             f"({said.own}) too")
    return (f"iteration {event.data.iteration} of the block at token {event.data.block_start}: "
            f"{counted(len(event.proposed), 'guess', 'guesses')} refined at once; {final}. {said.done}")


def explain_lookahead(event: StepEvent, said: Said, decode) -> str:
    data = event.data
    tried, matched = len(data.candidates), data.accept_length
    if tried:
        where = ", ".join(f"{number} {CANDIDATE_SOURCES.get(source, source)}"
                          for source, number in Counter(data.candidate_sources).items())
        best = (f"the best matched {counted(matched, 'token', 'tokens')} ({said.quoted(event.accepted)})" if matched
                else "none matched")
        checked = f" and verified {counted(tried, 'candidate n-gram', 'candidate n-grams')} ({where}); {best},"
    else:
        checked = ", with no candidate n-gram to verify,"
    return (f"the same pass advanced the window by one level{checked} then the target added {said.own}. "
            f"{said.done} The pool now holds {counted(data.pool_size, 'n-gram', 'n-grams')}.")


CANDIDATE_SOURCES = {"pool": "from the pool", "copy": "copied from the text", "retrieved": "from earlier answers"}


def explain_beam_step(event: StepEvent, said: Said, decode) -> str:
    quoted, beams = said.quoted, event.data.beams
    kept = [beam for beam in beams if beam["status"] == "kept"]
    pruned = sum(beam["status"] == "pruned" for beam in beams)
    best = max(kept or beams, key=lambda beam: beam["log_prob"])
    settled = (f"all beams now agree on {quoted(event.committed)}, so it is final" if event.committed
               else "the beams still disagree, so nothing is final yet")
    return (
        f"all {event.data.num_beams} beams ran in one batched pass; of their {len(beams)} best continuations "
        f"{len(kept)} were kept, {pruned} pruned{', and some finished' if len(kept) + pruned < len(beams) else ''}. "
        f"The best beam ends in {quoted(best['tokens'][-1:])} (log-probability {best['log_prob']:.2f}); {settled}."
    )


def explain_contrastive_step(event: StepEvent, said: Said, decode: Callable[[int], str]) -> str:
    data = event.data
    by_token = {candidate["token"]: candidate for candidate in data.candidates}
    chosen, expert = by_token[data.chosen], by_token.get(data.expert_choice)
    text = (f"the expert and the amateur each ran one pass; {decode(data.chosen)!r} won with log p_expert − log "
            f"p_amateur = {chosen['score']:.2f}")
    if data.expert_choice != data.chosen and expert is not None:
        text += (
            f", although the expert alone preferred {decode(data.expert_choice)!r}: the amateur liked that one too "
            f"(log p_amateur {expert['amateur_logprob']:.2f}), so its score was only {expert['score']:.2f}"
        )
    else:
        text += ", the expert's own favourite too"
    implausible = sum(not candidate["plausible"] for candidate in data.candidates)
    return text + (f". {implausible or 'None'} of the top candidates fell below the plausibility cut-off"
                   f"{' and could not win' if implausible else ''}.")


EXPLAIN = {  # a step's sentence, by the kind of its payload (AR's steps carry none)
    ChainStep: explain_chain,
    SamplingCheck: explain_chain,
    TreeStep: explain_tree,
    JacobiStep: explain_jacobi,
    LookaheadStep: explain_lookahead,
    BeamStep: explain_beam_step,
    ContrastiveStep: explain_contrastive_step,
}


def divergence_sentence(found, dtype: str, decode: Callable[[int], str], suspect_margin: float) -> str:
    """One sentence on why an answer first differs from AR's (`divergence.Divergence`): a
    near-tie that the dtype's rounding flipped, or a margin too wide for rounding (a possible bug)."""
    chosen, other = repr(decode(found.ar_token)), repr(decode(found.other_token))
    where = f"At token {found.position}, AR chose {chosen} and this method {other}."
    if found.margin > suspect_margin or dtype == "float32":
        return (f"{where} AR preferred {chosen} by {found.margin:.2f} in logit, more than {dtype} rounding moves a "
                f"logit (up to {suspect_margin} measured): this may be a bug; please report the prompt.")
    wide = (f" A pass over many tokens at once even preferred {other}." if found.wide_gap < 0 else "")
    gap = ("tied in logit (less than 0.005 apart)" if found.top_two < 0.005
           else f"only {found.top_two:.2f} apart in logit")
    return (f"{where} AR's two likeliest tokens here were {gap}. {dtype} rounds a pass of many tokens differently from "
            f"a pass of one, which flipped this near-tie.{wide} In float32 the answers are equal.")


def cllm_quality_html(quality: dict | None) -> str:
    """The CLLM's quality check (`training.cllm_quality`) in words, shown beside its answer."""
    if not quality:
        return ""
    bigrams, nll, bounds = quality["distinct_bigrams"], quality["nll_ratio"], quality["bounds"]
    verdict = "within" if quality["passes"] else "<b>outside</b>"
    return ("<p><b>Is the CLLM still a good model?</b> It is a fine-tuned copy, so its answers may differ from the "
            f"base model's. On {quality['prompts']} held-out prompts, {bigrams['cllm']:.2f} of its answers' word pairs "
            f"(token bigrams) were distinct against {bigrams['base']:.2f} for the base model (fewer means more "
            f"repetition), and the base model found its answers {nll:.2f}x as surprising per token as its own. That is "
            f"{verdict} our bounds (at most {bounds['max_bigram_drop']} fewer distinct pairs, at most "
            f"{bounds['max_nll_ratio']}x as surprising).</p>")


def counted(number: int, one: str, many: str) -> str:
    """"1 guess", "3 guesses": `number` and the word that agrees with it."""
    return f"{number} {one if number == 1 else many}"


def ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def copied_clauses(data: TreeStep) -> tuple[str, str]:
    """What a tree's guessed nodes (copied from the text, or retrieved from earlier answers) add to
    a step's sentence: how many nodes they were, and how many of the accepted tokens."""
    grown, taken = [], []
    for source, (done, words) in GUESSED.items():
        nodes = data.tree.sources.count(source)
        accepted = sum(data.tree.sources[node] == source for node in data.accepted_path)
        grown += [f"{nodes} more {'was' if nodes == 1 else 'were'} {done} {words}"] if nodes else []
        taken += [f"{accepted} of them {done}"] if accepted else []
    return (f", and {' and '.join(grown)}" if grown else ""), (f", {', '.join(taken)}" if taken else "")


GUESSED = {  # a tree's nodes that no model proposed, by source, in words
    "copy": ("copied", "from what followed the text's last tokens where they occurred before"),
    "retrieved": ("retrieved", "from what the model's earlier answers wrote after the same words"),
}


def how_html(plain: str, description: str) -> str:
    """A method in one plain sentence, its details and math folded away (Markdown with HTML)."""
    return f"{plain}\n\n<details><summary>The details, with the math</summary>\n\n{description}\n\n</details>"


def pass_cost_sentence(costs: dict[str, dict[int, float]], widths: tuple[int, ...], where: str, done: bool) -> str:
    """What a pass-cost measurement says so far (`costs`: {where the weights are: {tokens fed: ms}} of
    `widths` planned, on `where`, a device and dtype), in plain words: while it runs, how far it
    is; once `done`, what the widest pass measured costs against a pass of 1 token, for each line."""
    measured = min((len(by_width) for by_width in costs.values()), default=0)
    if not done:
        return f"<p>Measuring on this machine ({where}): {measured} of {len(widths)} widths done…</p>"
    if not measured:
        return "<p>The click's time ran out before a pass was measured: try again.</p>"
    widest = max(min(costs.values(), key=len))
    ratios = ", and ".join(f"{by_width[widest] / by_width[min(by_width)]:.1f}x a 1-token pass {name}"
                           for name, by_width in costs.items())
    cut = f" The click's time ran out after {measured} of {len(widths)} widths." if measured < len(widths) else ""
    return (f"<p>Measured on this machine ({where}), a few passes each: one pass checking {widest} tokens "
            f"costs {ratios}. Where that is near 1x, a method that checks many guesses a pass "
            f"loses little when they are wrong and gains whenever they are right.{cut}</p>")
