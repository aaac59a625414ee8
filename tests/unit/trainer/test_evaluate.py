"""The evaluate stage's entry on a rank: its command line."""

from __future__ import annotations

import pytest

from trainer.evaluate import main


def test_the_command_line_refuses_a_malformed_spec(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--spec", "{not json", "--model", "/m"])
    assert exited.value.code == 2
    assert "argument --spec: {not json: not valid JSON" in capsys.readouterr().err
