"""The evaluate stage's entry on a rank: its command line."""

from __future__ import annotations

import pytest

from storage.location import Location
from trainer.evaluate import main


def test_the_command_line_refuses_a_malformed_spec(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--spec", "{not json", "--model", "/m"])
    assert exited.value.code == 2
    assert "argument --spec: {not json: not valid JSON" in capsys.readouterr().err


def test_the_model_is_a_location_with_the_options_its_launcher_gave(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--model` is parsed once, as `--spec` is (launch/job.py `trainer_args` writes both): the evaluation reads the
    model with the options that came with it, never rebuilt from a string."""
    from trainer import harness
    from trainer.evaluation import stage

    seen: dict[str, object] = {}
    monkeypatch.setattr(stage, "evaluate", lambda spec, model, dist: seen.update(model=model))
    monkeypatch.setattr(harness, "run_rank", lambda spec, body, deepspeed_backend: body(None, None, None) or 0)
    model = Location("s3://b/runs/r/final", {"endpoint_url": "http://minio:9000"})
    assert main(["--spec", "/s/runs/r/spec.json", "--model", model.argument()]) == 0
    evaluated = seen["model"]
    assert isinstance(evaluated, Location) and evaluated == model and dict(evaluated.options) == dict(model.options)
    with pytest.raises(SystemExit) as exited:
        main(["--spec", "/s/runs/r/spec.json", "--model", "{not json"])
    assert exited.value.code == 2 and "argument --model: {not json: not valid JSON" in capsys.readouterr().err
