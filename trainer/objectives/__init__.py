"""The training objectives on a rank: what each computes, behind one contract.

- `base.py`: the contract (`TrainObjective`: what the step loop and the evaluation ask of an objective), its values
  (`MicroLoss`, `StepResult`, the metric sums) and the check that the staged rows are what the objective trains on;
- `step.py`: the optimizer step, the same for every objective;
- `registry.py`: the one map from the config's objectives (config/objectives.py) to the implementations here;
- `sft.py`: supervised fine-tuning (cross-entropy of the answers through the loss head of trainer/loss/) and its
  evaluation (loss, perplexity, token accuracy);
- `preference/`: DPO, IPO and ORPO on pairs (`pairs.py`), KTO on labelled answers (`kto.py`), what they share
  (`objective.py`: the step's counts, the evaluation), their losses as published (`losses.py`), their metric sums
  (`sums.py`), the reference model and full fine-tuning's reference table (`reference.py`, `reference_table.py`), and
  preference rows as micro-batches (`batching.py`).
"""
