"""The gate, its config, the registry CLI and the loss curve, on local storage (no torchrun, no Prefect server)."""

from __future__ import annotations

import io
import json

import pytest

from config.loader import load_config
from config.sections.results import GateConfig
from core.errors import UserError
from pipeline.gate import check_gate
from storage.location import Location
from storage.registry import champion, promote, read_entry, register_version, resolve, versions
from tests.conftest import run_cli
from tests.registry_helpers import entry

METRICS = {"loss": 2.31, "perplexity": 10.07, "token_accuracy": 0.42}


def registered(storage: Location, *losses: float) -> None:
    """Register one version per loss, promoting by loss as the register task does without a gate."""
    for i, loss in enumerate(losses):
        version, _ = register_version(storage, "m", entry(loss, f"w{i}"))
        promote(storage, "m", version, read_entry(storage, "m", version)["metrics"], "loss", "min")


@pytest.mark.parametrize(
    ("gate", "passed", "message"),
    [
        ({"threshold": 2.0}, False, "not registered: eval_loss 2.31 > threshold 2.0"),
        ({"threshold": 2.5}, True, "passed: eval_loss 2.31 <= threshold 2.5"),
        (
            {"metric": "token_accuracy", "direction": "max", "threshold": 0.5},
            False,
            "not registered: eval_token_accuracy 0.42 < threshold 0.5",
        ),
        ({"metric": "perplexity", "threshold": 20}, True, "passed: eval_perplexity 10.07 <= threshold 20.0"),
    ],
)
def test_threshold_gate_both_ways(tmp_path, gate: dict, passed: bool, message: str) -> None:
    result = check_gate(GateConfig(**gate), METRICS, Location(str(tmp_path)), "m")
    assert (result.passed, result.message) == (passed, message)


def test_champion_gate_both_ways(tmp_path) -> None:
    storage, gate = Location(str(tmp_path)), GateConfig(better_than="champion")
    first = check_gate(gate, METRICS, storage, "m")
    assert first.passed and first.message == "passed: eval_loss 2.31, and m has no champion yet"
    registered(storage, 2.5, 2.0, 2.2)
    assert champion(storage, "m")["version"] == 2
    worse = check_gate(gate, METRICS, storage, "m")
    assert not worse.passed
    assert worse.message == "not registered: eval_loss 2.31 is not better than champion v0002 (eval_loss 2.0)"
    assert check_gate(gate, {**METRICS, "loss": 2.0}, storage, "m").passed is False  # a tie does not beat it
    better = check_gate(gate, {**METRICS, "loss": 1.9}, storage, "m")
    assert better.passed and better.message == "passed: eval_loss 1.9 beats champion v0002 (2.0)"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "register.gate={threshold: 2.0, better_than: champion}",
            "register.gate: Value error, set exactly one of register.gate.threshold and register.gate.better_than",
        ),
        (
            "register.gate={metric: loss}",
            "register.gate: Value error, set exactly one of register.gate.threshold and register.gate.better_than",
        ),
        (
            "register.gate={metric: token_accuracy, threshold: 0.5}",
            "register.gate.direction must be max for token_accuracy, got min",
        ),
        ("register.gate={better_than: best}", "register.gate.better_than: Input should be 'champion'"),
        ("eval.generate_samples=-1", "eval.generate_samples: Input should be greater than or equal to 0"),
        ("eval.model=latest", "eval.model: Input should be 'final' or 'checkpoint'"),
    ],
)
def test_bad_gate_and_eval_config_is_one_line_naming_the_key(override: str, expected: str) -> None:
    with pytest.raises(UserError) as info:
        load_config(None, [override])
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_resolve_names_versions_and_the_champion(tmp_path) -> None:
    storage = Location(str(tmp_path))
    registered(storage, 2.5, 2.0, 2.2)
    assert [resolve(storage, ref)["version"] for ref in ("m", "m:1", "m:v2", "m:v0003", "m:champion")] == [
        3,
        1,
        2,
        3,
        2,
    ]
    with pytest.raises(UserError, match=r"m:v0009 is not registered under .* \(versions: v0001, v0002, v0003\)"):
        resolve(storage, "m:9")
    with pytest.raises(UserError, match=r"other: no such model in .*registry \(models: m\)"):
        resolve(storage, "other:champion")


def test_registry_cli_lists_and_shows_without_a_prefect_server(tmp_path) -> None:
    storage = Location(str(tmp_path / "storage"))
    registered(storage, 2.5, 2.0)
    env = {"PREFECT_API_URL": "http://127.0.0.1:9/api"}  # nothing listens there: the CLI must not need it
    listing = run_cli("flows.registry", "--storage", storage.url, "list", env=env, timeout=120)
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0].split() == ["model", "version", "created", "loss", "perplexity", "token_accuracy", "champion"]
    assert [line.split()[:2] + line.split()[3:4] for line in lines[1:]] == [
        ["m", "v0001", "2.5000"],
        ["m", "v0002", "2.0000"],
    ]
    assert lines[2].endswith("*") and not lines[1].endswith("*")

    shown = run_cli("flows.registry", "--storage", storage.url, "show", "m:champion", env=env, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("m v0002 (champion)\n")
    doc = json.loads(shown.stdout[shown.stdout.index("{") : shown.stdout.index("\nHow to load")])
    assert doc == read_entry(storage, "m", 2)
    assert 'model = PeftModel.from_pretrained(base, "/models/w1")' in shown.stdout

    missing = run_cli("flows.registry", "--storage", storage.url, "show", "m:v7", env=env, timeout=120)
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.strip() == f"error: m:v0007 is not registered under {storage} (versions: v0001, v0002)"


def test_a_registry_that_is_empty_lists_nothing(tmp_path) -> None:
    result = run_cli("flows.registry", "--storage", str(tmp_path), "list", timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == f"no models registered in {tmp_path}/registry"
    assert versions(Location(str(tmp_path)), "m") == []


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


def test_an_edited_entry_or_champion_is_refused_naming_the_file(tmp_path) -> None:
    from pathlib import Path

    storage = Location(str(tmp_path))
    registered(storage, 2.5)
    entry_file = Path(tmp_path) / "registry" / "m" / "v0001.json"
    entry_file.write_text(entry_file.read_text().replace('"loss": 2.5', '"loss": 1.5'))  # still valid JSON
    refused = rf"^{entry_file}: sha256 digest mismatch: recorded .* the registry file is corrupt"
    with pytest.raises(UserError, match=refused):
        read_entry(storage, "m", 1)
    alias = Path(tmp_path) / "registry" / "m" / "champion.json"
    alias.write_bytes(alias.read_bytes().replace(b'"version": 1', b'"version": 2'))
    with pytest.raises(UserError, match=rf"^{alias}: sha256 digest mismatch"):
        champion(storage, "m")
    assert json.loads(entry_file.read_text())["metrics"]["loss"] == 1.5  # refused, not repaired in place
