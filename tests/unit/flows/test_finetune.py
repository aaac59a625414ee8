"""What `python -m flows.finetune` ends with: the last train loss of metrics.jsonl (events are not steps) and the
final summary, with supervised or preference metrics as the evaluation measured them."""

from __future__ import annotations

import json

from flows.finetune import last_train_loss, print_summary
from storage.location import Location

SUMMARY = {
    "run_id": "r1",
    "train_loss": 1.2345,
    "checkpoint_url": "/s/runs/r1/checkpoints/step-00000012",
    "model_url": "/s/runs/r1/final",
    "loss_plot": None,
    "registered": True,
    "registration": "tiny v0003 (champion)",
    "registry_url": "/s/registry/tiny/v0003.json",
}


def test_the_last_train_loss_is_the_last_step_lines(tmp_path) -> None:
    records = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}, {"event": "final_eval", "step": 2, "loss": 1.7}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert last_train_loss(Location(str(tmp_path))) == 1.5
    assert last_train_loss(Location(str(tmp_path / "none"))) is None


def test_the_summary_shows_what_the_evaluation_measured(capsys) -> None:
    sft = {"loss": 1.5, "perplexity": 4.4817, "token_accuracy": 0.61234, "target_tokens": 800}
    print_summary({**SUMMARY, "eval": sft})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "" and lines[1:4] == ["run            r1", "train loss     1.2345", "eval loss      1.5000"]
    assert "perplexity     4.48" in lines and "token accuracy 0.6123 (800 target tokens)" in lines
    assert lines[-2:] == ["loss curve     n/a", "registered     tiny v0003 (champion) (/s/registry/tiny/v0003.json)"]
    preference = {"loss": 0.6, "reward_accuracy": 0.75, "units": 40, "reward_margin": 0.321}
    print_summary(
        {**SUMMARY, "train_loss": None, "registered": False, "registration": "not registered", "eval": preference}
    )
    out = capsys.readouterr().out
    assert "train loss     n/a" in out and "reward acc.    0.7500 (40 eval units)" in out
    assert (
        "reward margin  0.3210" in out and "perplexity" not in out and out.endswith("registered     not registered\n")
    )
