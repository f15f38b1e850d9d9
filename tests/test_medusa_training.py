"""The Medusa heads' training loss (training/train_medusa.py) on synthetic answers: heads that read
the token their hidden state predicted learn what only that token tells; heads that do not, cannot."""

import torch

from specdemo.methods.medusa_heads import MedusaHeads
from training.train_medusa import soft_loss

from conftest import make_tiny_model


def answer_states(model, tokens: torch.Tensor, generator: torch.Generator) -> dict:
    """`answer_states`' output for one answer `tokens` with noise for hidden states: position t
    (t = 0..n-1) predicts tokens[t + 1], and the teacher is sure of it."""
    n = len(tokens) - 1
    return {
        "hidden": torch.randn(n, model.config.hidden_size, generator=generator),
        "next": tokens[1:],
        "teacher_ids": tokens[1:, None],
        "teacher_probs": torch.ones(n, 1),
        "rest": torch.arange(n - 1, -1, -1),
    }


def loss_after_training(heads: MedusaHeads, states: dict, generator: torch.Generator) -> float:
    """The heads' loss over every position after 300 steps of AdamW on batches of 128."""
    n = len(states["next"])
    optimizer = torch.optim.AdamW(heads.parameters(), lr=1e-2)
    for _ in range(300):
        loss = soft_loss(heads, states, torch.randint(0, n, (128,), generator=generator))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return float(soft_loss(heads, states, torch.arange(n)))


def test_only_heads_that_read_the_token_learn_what_it_alone_determines():
    """One long answer whose every token follows from the one before (a fixed permutation of 32
    tokens) and hidden states that are noise: head k must predict token t + k + 2 from token t + 1
    alone. After the same training the heads that read it have a far lower loss."""
    model = make_tiny_model()
    generator = torch.Generator().manual_seed(0)
    follows = torch.randperm(32, generator=generator)
    tokens = [0]
    for _ in range(1024):
        tokens.append(int(follows[tokens[-1]]))
    tokens = torch.tensor(tokens)
    states = answer_states(model, tokens, generator)
    losses = {}
    for reads in (False, True):
        torch.manual_seed(0)
        heads = MedusaHeads(model.config.hidden_size, model.config.vocab_size, 2,
                            shared_lm_head=model.get_output_embeddings(),
                            embedding=model.get_input_embeddings() if reads else None)
        losses[reads] = loss_after_training(heads, states, generator)
    assert losses[True] < 0.5 * losses[False]


def test_heads_that_read_their_path_learn_what_only_the_path_determines():
    """An answer of pairs: a random token, then the token a fixed permutation makes of it. Head 1
    guesses token t + 3; where that is the second of a pair only token t + 2, which a head reading
    its path is given (teacher-forced, `head_tokens`) and a head reading token t + 1 alone is not,
    determines it. After the same training the heads that read their path have the lower loss."""
    from training.train_medusa import head_tokens

    model = make_tiny_model()
    generator = torch.Generator().manual_seed(0)
    follows = torch.randperm(32, generator=generator)
    firsts = torch.randint(0, 32, (512,), generator=generator)
    tokens = torch.stack([firsts, follows[firsts]], dim=1).flatten()
    states = answer_states(model, tokens, generator)
    n = len(tokens) - 1
    losses = {}
    for reads_path in (False, True):
        torch.manual_seed(0)
        heads = MedusaHeads(model.config.hidden_size, model.config.vocab_size, 2,
                            shared_lm_head=model.get_output_embeddings(),
                            embedding=model.get_input_embeddings(), reads_path=reads_path)
        if reads_path:
            assert head_tokens(heads, states, torch.tensor([0, n - 1])).tolist() == [tokens[1:3].tolist(),
                                                                                     [tokens[-1]] * 2]
        losses[reads_path] = loss_after_training(heads, states, generator)
    assert losses[True] < losses[False] - 0.3
