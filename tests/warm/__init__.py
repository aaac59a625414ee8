"""Warm starts for the test suite: agents and ranks forked from an interpreter that has imported torch, transformers,
DeepSpeed and PEFT once (tests/README.md, "Warm starts")."""
