"""The `train.preference` section (config/sections/preference.py): its defaults (DPO's beta 0.1, no label smoothing,
KTO's weights 1), values at the edges of its bounds accepted and reaching train.preference, and each value beyond them,
an unknown key or a value of the wrong type refused in one line naming the key. The objective's checks against the
rest of the config (the data.preference it implies, a contradicting explicit setting, full fine-tuning of KTO) are
config/objectives.py's and config/schema.py's, tested in tests/unit/config/test_objectives.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from config.loader import load_config
from config.sections.preference import PreferenceConfig
from core.errors import UserError


def test_the_defaults_are_plain_dpo_and_unweighted_kto() -> None:
    assert PreferenceConfig().model_dump() == {
        "beta": 0.1,
        "label_smoothing": 0.0,
        "desirable_weight": 1.0,
        "undesirable_weight": 1.0,
    }
    assert load_config(None, ["train.objective=dpo"]).train.preference == PreferenceConfig()


def test_values_at_the_edges_of_the_bounds_reach_the_run() -> None:
    settings = ["beta=100", "label_smoothing=0.49", "desirable_weight=2.5", "undesirable_weight=0.01"]
    cfg = load_config(None, ["train.objective=kto", *(f"train.preference.{s}" for s in settings)])
    assert cfg.train.preference == PreferenceConfig(
        beta=100.0, label_smoothing=0.49, desirable_weight=2.5, undesirable_weight=0.01
    )
    assert load_config(None, ["train.preference.beta=1e-9"]).train.preference.beta == 1e-9


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("beta=0", "train.preference.beta: Input should be greater than 0 (got 0)"),
        ("beta=100.5", "train.preference.beta: Input should be less than or equal to 100 (got 100.5)"),
        ("label_smoothing=-0.1", "train.preference.label_smoothing: Input should be greater than or equal to 0"),
        ("label_smoothing=0.5", "train.preference.label_smoothing: Input should be less than 0.5 (got 0.5)"),
        ("desirable_weight=0", "train.preference.desirable_weight: Input should be greater than 0 (got 0)"),
        ("undesirable_weight=-1", "train.preference.undesirable_weight: Input should be greater than 0 (got -1)"),
        ("beta=abc", "train.preference.beta: Input should be a valid number"),
        (
            "gamma=1",
            "train.preference.gamma: unknown key (allowed here: beta, label_smoothing, desirable_weight, "
            "undesirable_weight)",
        ),
    ],
)
def test_a_value_beyond_its_bounds_is_one_line_naming_its_key(override: str, expected: str) -> None:
    with pytest.raises(UserError) as info:
        load_config(None, [f"train.preference.{override}"])
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_the_section_is_frozen() -> None:
    settings = PreferenceConfig(beta=0.3)
    with pytest.raises(ValidationError):
        settings.beta = 0.5  # type: ignore[misc]
    assert settings.beta == 0.3
