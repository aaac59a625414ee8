"""What an example longer than data.max_length keeps (data.excess_length: truncate), in tokens of its one encoding.

Truncation keeps one window of the encoding, chosen so that a target always remains:

1. When the first target turn ends within the limit, whole later turns are dropped: the window ends after the
   last assistant turn (its end token and newline included) that ends within the limit, so every complete turn
   that fits is kept and no turn is cut in half.
2. When the first target turn alone does not fit, its prompt is cut from the left (the context nearest the
   answer stays, the assistant header with it) and its response from the right (the answer's beginning stays).
   The response's share of the budget follows LLaMA-Factory's rule (`infer_seqlen`): a response shorter than
   half the budget is kept whole, a prompt shorter than half leaves the response the rest, and otherwise each
   keeps its proportional share.

A plain-text example is a single target turn with no prompt: rule 2 keeps its head.
"""

from __future__ import annotations

TokenRange = tuple[int, int]  # [first, stop) token indices of the encoding


def budget_split(prompt: int, response: int, budget: int) -> tuple[int, int]:
    """(prompt tokens, response tokens) kept of a prompt + response that do not fit in `budget` together.
    The response keeps at least one token, and the prompt one when it has any (the first target's predictor)."""
    if 2 * response < budget:
        kept = response
    elif 2 * prompt < budget:
        kept = budget - prompt
    else:
        kept = budget * response // (prompt + response)
    kept = min(response, max(kept, 1))
    if prompt and budget > 1:
        kept = min(kept, budget - 1)
    return min(prompt, budget - kept), kept


def window(n_tokens: int, turns: list[TokenRange], first_target: TokenRange, max_length: int) -> TokenRange:
    """The [first, stop) tokens an example keeps: all of it when it fits, else by the rules above. `turns` are
    every assistant turn's token range (trained or not), in order; `first_target` is the first trained one."""
    if n_tokens <= max_length:
        return 0, n_tokens
    start, stop = first_target
    if stop <= max_length:
        return 0, max(end for _, end in turns if end <= max_length)
    prompt, response = budget_split(start, stop - start, max_length)
    return start - prompt, start + response
