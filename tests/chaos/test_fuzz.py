"""Bad input, fuzzed (hypothesis): malformed records in every format (Qwen, ShareGPT, OpenAI, Alpaca) and container
(JSONL, JSON array, Parquet), and invalid config values, must always end in one line that names the location
(path:line, path[index], path#row, or the config key), never a traceback, and never leave a partial dataset.

Each chaos run is one hypothesis run with a seed derived from the session's: many examples through the same
functions the CLI calls (stage_dataset, load_config), a few through the real `python -m flows.prepare`.
Replay one with TANDEM_CHAOS_SEED; hypothesis prints the shrunk failing example.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings

from config.loader import load_config
from config.sections.run_data import DataConfig
from core.errors import EXIT_USER_ERROR, TandemError, UserError
from staging.stage import stage_dataset
from storage.location import Location
from tests.chaos.fuzz_cases import DataCase, config_overrides, data_cases
from tests.conftest import run_cli

IN_PROCESS_EXAMPLES = int(os.environ.get("TANDEM_FUZZ_EXAMPLES", "60"))
CLI_EXAMPLES = 2


def fuzz_settings(examples: int, shrink: bool = True) -> settings:
    phases = [Phase.generate, Phase.shrink] if shrink else [Phase.generate]
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=phases,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )


def files_under(root: Path) -> list[str]:
    """Every file below `root` (the storage must hold none after a refused input)."""
    return [str(p) for p in root.rglob("*") if p.is_file()] if root.exists() else []


def check_data_error(case: DataCase, path: str, message: str) -> None:
    """One line, starting with the first bad record's location (or the file's, when the file itself is bad)."""
    assert "\n" not in message, message
    if case.undetectable() and message.startswith(f"cannot tell the format of {path}:"):
        return
    assert message.startswith(case.expected(path)), f"expected {case.expected(path)!r}..., got {message!r}"


def test_fuzz_malformed_records_in_process(chaos_run, chaos_rng, chaos_record, tiny_model, tmp_path) -> None:
    run_seed = chaos_rng.randrange(1 << 32)
    examples = {"n": 0}
    lost: list[str] = []

    @fuzz_settings(IN_PROCESS_EXAMPLES)
    @seed(run_seed)
    @given(case=data_cases())
    def check(case: DataCase) -> None:
        examples["n"] += 1
        work = Path(tmp_path) / f"ex{examples['n']}"
        work.mkdir()
        path = case.write(work)
        storage = work / "storage"
        data = DataConfig(source=path, format=case.read_as, max_length=64)
        with pytest.raises(UserError) as info:
            stage_dataset(data, Location(str(storage)), tiny_model, progress=lambda _: None, bars=False)
        partial = files_under(storage)
        lost.extend(partial)
        assert not partial, f"files left under the storage after a refused input: {partial}"
        check_data_error(case, path, str(info.value))
        shutil.rmtree(work)

    started = time.monotonic()
    try:
        check()
    finally:
        chaos_record(
            "bad input: malformed records, 4 formats x 3 containers (in process)",
            data_lost=bool(lost),
            examples=examples["n"],
            hypothesis_seed=run_seed,
            seconds=round(time.monotonic() - started, 1),
        )


def test_fuzz_invalid_config_values(chaos_run, chaos_rng, chaos_record) -> None:
    run_seed = chaos_rng.randrange(1 << 32)
    seen = {"n": 0, "refused": 0}

    @fuzz_settings(IN_PROCESS_EXAMPLES * 3)
    @seed(run_seed)
    @given(override=config_overrides())
    def check(override: tuple[str, str]) -> None:
        key, assignment = override
        seen["n"] += 1
        try:
            load_config(None, [assignment])
        except TandemError as exc:
            seen["refused"] += 1
            message = str(exc)
            assert "\n" not in message, message
            assert key in message, f"--set {assignment!r}: the error does not name {key}: {message!r}"

    try:
        check()
    finally:
        chaos_record(
            "bad input: invalid config values (in process)",
            data_lost=False,
            examples=seen["n"],
            refused=seen["refused"],
            hypothesis_seed=run_seed,
        )


@pytest.fixture(scope="module")
def api_url(prefect_server) -> str:
    """The session's Prefect server, so that each CLI run does not start a temporary one."""
    from prefect.settings import PREFECT_API_URL

    return str(PREFECT_API_URL.value())


def test_fuzz_the_prepare_cli(chaos_run, chaos_rng, chaos_record, tiny_model, tmp_path, api_url) -> None:
    run_seed = chaos_rng.randrange(1 << 32)
    examples = {"n": 0}
    lost: list[str] = []

    @fuzz_settings(CLI_EXAMPLES, shrink=False)
    @seed(run_seed)
    @given(case=data_cases())
    def check(case: DataCase) -> None:
        examples["n"] += 1
        work = Path(tmp_path) / f"ex{examples['n']}"
        work.mkdir()
        path = case.write(work)
        storage = work / "storage"
        result = run_cli(
            "flows.prepare",
            "--data",
            path,
            "--format",
            case.read_as,
            "--storage",
            str(storage),
            "--set",
            f"model.name_or_path={tiny_model}",
            "--set",
            "data.max_length=64",
            env={"PREFECT_API_URL": api_url},
            timeout=300,
        )
        output = result.stdout + result.stderr
        assert "Traceback" not in output, output[-3000:]
        assert result.returncode == EXIT_USER_ERROR, output[-3000:]
        errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, result.stderr[-3000:]
        partial = files_under(storage)
        lost.extend(partial)
        assert not partial, f"files left under the storage after a refused input: {partial}"
        check_data_error(case, path, errors[0].removeprefix("error: "))

    try:
        check()
    finally:
        chaos_record(
            "bad input: malformed records through python -m flows.prepare",
            data_lost=bool(lost),
            examples=examples["n"],
            hypothesis_seed=run_seed,
        )
