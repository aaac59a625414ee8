"""The loss heads: how a model's output meets a loss, in one place, for every objective (trainer/objectives/) to take.

- `cross_entropy.py`: cross-entropy of each position's prediction of the next token, from full logits;
- `chunked.py`: the same loss from the last hidden states (`LossHead`): the output layer applied to the target
  positions only, in one pass or in chunks recomputed in backward, under ZeRO-3 too; what SFT trains and evaluates with;
- `logps.py`: each sequence's summed log-probability of its targets, from full logits; what the preference objectives
  and their reference table compare.

A fused kernel (a fused linear cross-entropy, a fused preference loss) is another head here, chosen by the objective
that uses it; the objectives do not compute a loss from logits themselves.
"""
