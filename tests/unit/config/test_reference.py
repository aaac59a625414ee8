"""The configuration reference (docs/reference/configuration.md) against the schema it is generated from: the committed
page is what the generator writes today, every key is on it with its type, default, bounds and description, each
preset's values are listed, and a field without a description stops the generator with a line naming it."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import get_args, get_origin

import pytest
from pydantic import BaseModel, Field

from config.reference import (
    COMMAND,
    PAGE,
    MissingDescription,
    Table,
    main,
    missing_descriptions,
    render,
    section_markdown,
)
from config.schema import FinetuneConfig
from config.sections.base import Section
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def page() -> str:
    return render()


def test_the_committed_page_is_what_the_schema_gives(page: str) -> None:
    committed = (ROOT / PAGE).read_text(encoding="utf-8")
    if committed != page:
        diff = "".join(list(difflib.unified_diff(committed.splitlines(True), page.splitlines(True), n=0))[:12])
        pytest.fail(f"{PAGE} does not match the schema; run {COMMAND}\n{diff}")


def keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every dotted key of a model, nested sections (and the entries of a list of sections, `key[].`) included."""
    found = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        found.append(key)
        for arg in (field.annotation, *get_args(field.annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                found += keys(arg, f"{key}.")
            elif get_origin(arg) is list and isinstance(item := get_args(arg)[0], type) and issubclass(item, BaseModel):
                found += keys(get_args(arg)[0], f"{key}[].")
    return found


def test_every_key_has_a_row(page: str) -> None:
    every = keys(FinetuneConfig)
    assert "data.sources[].weight" in every and "train.lora.r" in every and "register.gate.metric" in every
    sections = [key for key in every if "." not in key]  # the top level: a table each, no row
    assert sections == list(FinetuneConfig.model_fields)
    missing = [key for key in every if key not in sections and f"| `{key}` |" not in page]
    missing += [key for key in sections if f"\n## {key}\n" not in page]
    assert not missing, f"keys without a row (sections without a table) on the page: {missing}"


def test_a_row_shows_type_default_bounds_and_description(page: str) -> None:
    assert "| `train.learning_rate` | `float` | `0.0003` | > 0.0, ≤ 1.0 | Peak learning rate. |" in page
    assert "| `data.on_invalid` | one of `fail`, `skip` | `fail` |  |" in page
    assert "| `data.sources[].source` | `str` | *required* | length ≥ 1 |" in page
    assert "| `run.name` | `str` or null | `null` | matches `^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$` |" in page
    assert "| `launch.slurm_args` | list of `str` | `[]` |" in page
    assert "| `register.gate` | section [`register.gate`](#registergate) or null | `null` |" in page


def test_each_preset_lists_the_keys_it_sets_beside_the_default(page: str) -> None:
    presets = page.split("## Presets", 1)[1]
    tiny = presets.split("### tiny-cpu", 1)[1].split("###", 1)[0]
    assert "python -m flows.finetune --config tiny-cpu" in tiny
    assert "| `train.max_steps` | `30` | `null` |" in tiny
    full = presets.split("### qwen-14b-full", 1)[1].split("###", 1)[0]
    assert "| `deepspeed.config` | `config/deepspeed/zero3.json` | `config/deepspeed/zero2.json` |" in full


class Inner(Section):
    """A nested section: its docstring describes the field that holds it."""

    documented: int = Field(1, description="Documented.")
    bare: int = 2


class Outer(Section):
    """A section with keys that lack a description."""

    inner: Inner = Field(default_factory=Inner)
    items: list[Inner] | None = Field(None, description="Several inner sections.")
    also_bare: str = "x"


def test_fields_without_a_description_are_named() -> None:
    assert missing_descriptions() == []
    assert missing_descriptions(Outer) == ["inner.bare", "items[].bare", "also_bare"]
    with pytest.raises(MissingDescription, match=r"^outer\.also_bare has no description; add description=\.\.\."):
        section_markdown(Table("outer", Outer))


def test_check_fails_on_a_stale_page_with_the_command_to_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text(render().replace("Peak learning rate.", "Peak rate."), encoding="utf-8")
    assert main(["--check", str(stale)]) == 1
    assert f"run python -m config.reference --write {stale}" in capsys.readouterr().err
    assert main(["--write", str(stale)]) == 0
    assert main(["--check", str(stale)]) == 0
