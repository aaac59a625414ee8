"""Checkpoints on a rank, in one place: what a rank does with DeepSpeed (`deepspeed_io.py`: save, load, publish),
the policy (`policy.py`: resume, the save interval, the save on cancel, retention, the export), which checkpoint to
resume (`resume.py`), resuming on another world size (`reshard.py`) and the exported model (`export.py`). What a
checkpoint is on storage (manifest, COMPLETE, which ones exist) is storage/checkpoints.py's."""
