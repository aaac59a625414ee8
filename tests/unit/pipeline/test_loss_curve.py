"""The loss curve of a run (loss.png): the train steps of metrics.jsonl and the evaluation points, events left out."""

from __future__ import annotations

import io
import json

from storage.location import Location


def test_loss_curve_plots_train_steps_and_eval_points(tmp_path) -> None:
    from PIL import Image

    from pipeline.loss_curve import loss_series, write_loss_plot
    from storage.metrics import read_metrics

    run = tmp_path / "run"
    run.mkdir()
    records = [{"step": s, "loss": 5.0 - s / 10, "lr": 0.1} for s in range(1, 11)]
    records.insert(4, {"event": "straggler", "step": 4, "rank": 1})
    records.append({"event": "final_eval", "step": 10, "loss": 4.2})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    train, evals = loss_series(read_metrics(Location(str(run))), [(10, 4.25)])
    assert train == (list(range(1, 11)), [5.0 - s / 10 for s in range(1, 11)])
    assert evals == ([10], [4.25])  # eval.json's value for the step replaces the trainer's in-memory one
    url = write_loss_plot(Location(str(run)), [(10, 4.25)], "test")
    assert str(url) == str(run / "loss.png")
    image = Image.open(io.BytesIO((run / "loss.png").read_bytes()))
    assert image.format == "PNG" and image.size[0] > 300 and image.size[1] > 200
    assert write_loss_plot(Location(str(tmp_path / "empty")), [], "none") is None


def test_online_rls_rewards_go_on_a_second_axis_with_the_eval_reward() -> None:
    from pipeline.loss_curve import render_png, reward_series

    records = [{"step": 1, "loss": 0.0, "reward": 0.1}, {"event": "checkpoint", "step": 1}, {"step": 2, "loss": 0.0,
               "reward": 0.4}]  # fmt: skip
    assert reward_series(records) == ([1, 2], [0.1, 0.4])
    assert reward_series([{"step": 1, "loss": 2.0}]) == ([], [])
    png = render_png(([1, 2], [0.0, 0.0]), ([2], [-0.5]), "grpo", reward_series(records))
    assert png.startswith(b"\x89PNG")
