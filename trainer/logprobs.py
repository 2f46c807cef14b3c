"""Log-probs of a batch's response tokens, computed once per distinct row (docs/training.md)."""

from __future__ import annotations

import torch

from agentflow.trainer.batch import sequence_logprobs


def distinct_rows(batch) -> int:
    """How many distinct token rows ``batch`` holds (the step's ``unique_rows`` metric)."""
    return len({tuple(r[m.bool()].tolist()) for r, m in zip(batch.input_ids, batch.attention_mask)})


def unique_row_logprobs(model, batch) -> tuple[torch.Tensor, torch.Tensor]:
    """``sequence_logprobs`` (with entropy) computed once per distinct row and gathered back: ``[B, L]`` each.

    Exact: a row's log-probs depend only on its tokens, and the gather sums the gradients of repeated rows.
    Rows repeat a lot here — the G trajectories of a group share their first prompt, and with deterministic frozen
    modules the same tool choices lead to the same later prompts — so this often halves the work or better.
    """
    ids, attn, resp = batch.input_ids, batch.attention_mask, batch.response_mask
    index: dict[tuple, int] = {}
    firsts, inverse = [], []
    for b in range(ids.shape[0]):
        n = int(attn[b].sum())
        key = (tuple(ids[b, :n].tolist()), tuple(resp[b, :n].nonzero().squeeze(-1).tolist()))
        if key not in index:
            index[key] = len(firsts)
            firsts.append(b)
        inverse.append(index[key])
    rows, back = torch.tensor(firsts, device=ids.device), torch.tensor(inverse, device=ids.device)
    logp, entropy = sequence_logprobs(model, ids[rows], attn[rows], resp[rows], with_entropy=True)
    back = back.to(logp.device)
    return logp[back], entropy[back]
