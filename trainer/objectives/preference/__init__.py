"""The preference objectives: DPO, IPO and ORPO on pairs, KTO on labelled answers (see trainer/objectives/__init__.py
for each module, docs/preference-tuning.md for the equations and the settings)."""
