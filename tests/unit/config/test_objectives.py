"""The objectives as the config knows them (config/objectives.py): `train.objective` is the registry's object, read
from its name and written back as it; the objective implies data.preference (a DPO run needs no data.preference, and
the dataset it stages is the one the explicit setting stages); a setting that contradicts it, a gate on a metric it
does not measure, full fine-tuning of KTO and packed pairs are each refused in one line naming the keys and the fix;
and each objective describes itself for the model card and eval.json."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from config.loader import load_config
from config.methods import FULL, LORA, QLORA
from config.objectives import DPO, GRPO, KTO, OBJECTIVES, ORPO, SFT, trained_on
from config.schema import FinetuneConfig
from config.sections.preference import PreferenceConfig
from config.sections.rl import RlConfig
from config.sections.run_data import DataConfig
from core.errors import UserError
from staging.identity import survey
from staging.progress import Reporter

PAIRS_FILE = str(Path(__file__).resolve().parents[3] / "data" / "sample" / "preferences.jsonl")


def test_the_objective_is_the_registrys_object_and_its_name_in_files() -> None:
    cfg = FinetuneConfig.model_validate({"train": {"objective": "kto"}})
    assert cfg.train.objective is KTO and FinetuneConfig().train.objective is SFT
    dumped = cfg.model_dump(mode="json")
    assert dumped["train"]["objective"] == "kto" and cfg.model_dump()["train"]["objective"] == "kto"
    assert FinetuneConfig.model_validate(dumped) == cfg  # spec.json's round trip
    assert yaml.safe_load(yaml.safe_dump(dumped))["train"]["objective"] == "kto"  # --print-config's
    schema = FinetuneConfig.model_json_schema()["$defs"]["TrainConfig"]["properties"]["objective"]
    assert (schema["enum"], schema["default"]) == (list(OBJECTIVES), "sft")  # the UI form's choices
    with pytest.raises(UserError) as info:
        load_config(None, ["train.objective=ppo"])
    assert "train.objective: Input should be 'sft', 'dpo', 'ipo', 'kto', 'orpo' or 'grpo' (got 'ppo')" in str(
        info.value
    )


@pytest.mark.parametrize(
    ("objective", "preference"),
    [("sft", "refuse"), ("dpo", "pairs"), ("ipo", "pairs"), ("kto", "pairs"), ("grpo", "prompts")],
)
def test_an_empty_data_preference_is_what_the_objective_trains_on(objective: str, preference: str) -> None:
    cfg = FinetuneConfig.model_validate({"train": {"objective": objective}})
    assert cfg.data.preference == preference
    assert cfg.model_dump(mode="json")["data"]["preference"] == preference  # spec.json and --print-config say it


def test_a_dpo_run_on_pairs_needs_no_data_preference_and_stages_the_same_dataset() -> None:
    """The dataset's identity (its source key, from which the dataset id follows) is the same whether the objective
    implies data.preference or the config sets it as before; a data section on its own stages as sft implies."""
    implied = load_config(None, [f"data.source={PAIRS_FILE}", "train.objective=dpo"])
    explicit = load_config(None, [f"data.source={PAIRS_FILE}", "train.objective=dpo", "data.preference=pairs"])
    assert implied.data == explicit.data and implied.data.preference == "pairs"

    def key(data: DataConfig) -> str:
        return survey(data, {"tokenizer": "fixed"}, Reporter(lambda _: None, bars=False)).source_key

    assert key(implied.data) == key(explicit.data)
    supervised = DataConfig(source=PAIRS_FILE)
    assert supervised.preference is None and supervised.preference_mode == "refuse"
    assert key(supervised) == key(supervised.model_copy(update={"preference": "refuse"})) != key(implied.data)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"data": {"preference": "pairs"}},
            "train.objective=sft trains on supervised rows, which data.preference=pairs does not stage; leave "
            "data.preference empty (sft implies refuse), set it to refuse or chosen, or set train.objective to dpo, "
            "ipo, kto or orpo",
        ),
        (
            {"data": {"preference": "refuse"}, "train": {"objective": "dpo"}},
            "train.objective=dpo trains on pairs, which data.preference=refuse does not stage; leave data.preference "
            "empty (dpo implies pairs), set it to pairs, or set train.objective to sft",
        ),
        (
            {"data": {"preference": "chosen"}, "train": {"objective": "kto"}},
            "train.objective=kto trains on KTO feedback (answers labelled true or false), which data.preference=chosen "
            "does not stage; leave data.preference empty (kto implies pairs), set it to pairs, or set train.objective "
            "to sft",
        ),
        (
            {"data": {"preference": "pairs", "packing": True}, "train": {"objective": "dpo"}},
            "data.packing: preference data is not packed (a pair is one row); leave data.packing empty or false",
        ),
        (
            {"data": {"packing": True}, "train": {"objective": "orpo"}},
            "data.packing: preference data is not packed (a pair is one row); leave data.packing empty or false",
        ),
        (
            {"train": {"objective": "kto", "method": "full"}},
            "train.objective=kto with train.method=full: KTO's reference point compares each answer with another "
            "prompt's answer chosen by the batch, which the reference computed once before full fine-tuning cannot "
            "hold; use train.method lora or qlora (the reference is the model with its adapters disabled), or dpo, "
            "ipo or orpo on pairs",
        ),
        (
            {"register": {"gate": {"metric": "reward_accuracy", "direction": "max", "threshold": 0.6}}},
            "register.gate.metric=reward_accuracy is not measured for train.objective=sft; use loss or one of "
            "perplexity, token_accuracy",
        ),
        (
            {"train": {"objective": "ipo"}, "register": {"gate": {"metric": "perplexity", "threshold": 9.0}}},
            "register.gate.metric=perplexity is not measured for train.objective=ipo; use loss or one of "
            "reward_accuracy, reward_margin, chosen_logps_per_token, rejected_logps_per_token",
        ),
    ],
)
def test_config_mismatches_are_refused_in_one_line(settings: dict, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        FinetuneConfig.model_validate(settings)
    assert message in str(info.value)


def test_the_cli_refuses_a_contradiction_in_one_line_naming_both_keys() -> None:
    with pytest.raises(UserError) as info:
        load_config(None, ["train.objective=dpo", "data.preference=chosen"])
    message = str(info.value)
    assert "\n" not in message and "train.objective=dpo" in message and "data.preference=chosen" in message


def test_orpo_trains_full_weights_and_a_preference_gate_is_accepted() -> None:
    cfg = FinetuneConfig.model_validate(
        {
            "train": {"objective": "orpo", "method": "full"},
            "register": {"gate": {"metric": "reward_accuracy", "direction": "max", "threshold": 0.6}},
        }
    )
    assert cfg.train.objective is ORPO and cfg.data.preference == "pairs"


def test_each_objective_trains_on_one_kind_of_data() -> None:
    assert trained_on(SFT.data) == ["sft"]
    assert trained_on(DPO.data) == ["dpo", "ipo", "orpo"]
    assert trained_on(KTO.data) == ["kto"]
    assert trained_on(GRPO.data) == ["grpo"]
    assert [o.name for o in OBJECTIVES.values() if o.reference] == ["dpo", "ipo", "kto", "grpo"]


def test_each_objective_describes_itself_for_the_card_and_eval_json() -> None:
    settings = PreferenceConfig(beta=0.2, label_smoothing=0.1, desirable_weight=1.5)
    assert SFT.card(settings, LORA, "/m") == "sft (supervised: cross-entropy of the answers)"
    assert ORPO.card(settings, FULL, "/m") == "orpo (lambda 0.2); no reference model"
    assert OBJECTIVES["ipo"].card(settings, QLORA, "/m") == (
        "ipo (tau 0.2); reference: the base model `/m` (the adapters disabled)"
    )
    assert DPO.card(settings, FULL, "/m") == (
        "dpo (beta 0.2, label smoothing 0.1); reference: the base model `/m`'s log-probabilities of every pair, "
        "computed before training (the run's reference/)"
    )
    assert KTO.card(settings, LORA, "/m").startswith("kto (beta 0.2, desirable weight 1.5, undesirable weight 1)")
    assert (SFT.reference_words(LORA), ORPO.reference_words(FULL)) == (None, None)
    assert DPO.reference_words(QLORA) == "the base model (qlora adapters disabled)"
    assert DPO.reference_words(FULL).startswith("the base model's log-probabilities, computed before training")


def test_grpo_compares_with_a_reference_only_with_beta_and_says_which() -> None:
    """GRPO's reference is the base model when train.rl.beta > 0 (TRL's default 0: none): the adapters disabled, or
    under full fine-tuning a frozen copy; its card row names its settings."""
    none, kl = RlConfig(), RlConfig(beta=0.04, epsilon_high=0.28)
    assert GRPO.card(none, LORA, "/m") == (
        "grpo (group size 8, beta 0, epsilon 0.2, epsilon high 0.2, loss dapo, scale rewards group, iterations 1, "
        "temperature 1); no reference model"
    )
    assert GRPO.card(kl, LORA, "/m").endswith("; reference: the base model `/m` (the adapters disabled)")
    assert GRPO.card(kl, FULL, "/m").endswith(
        "; reference: the base model `/m`, a frozen copy loaded beside the policy"
    )
    assert GRPO.reference_words(LORA, none) is None
    assert GRPO.reference_words(FULL, kl) == "the base model, a frozen copy loaded beside the policy"
