"""The training objectives as every layer knows them: SFT, DPO, IPO, KTO, ORPO and GRPO, each one `Objective`, and the
one registry that maps their names to them (`OBJECTIVES`). `train.objective` holds the object itself: its name is read
once, where the config is validated, and written back where the config is (spec.json, `--print-config`, the UI form).

What an objective says here, without torch:

- what it trains on (`data`, a `DataKind`: supervised rows, pairs, KTO feedback, or prompts), and so which
  `data.preference` settings stage that data; the first is what an unset `data.preference` becomes (config/schema.py);
- the evaluation metrics it reports beside the loss (`metrics`), which are also the ones a `register.gate` may compare;
- whether it compares the policy with a reference model (`reference`; GRPO's only when its `reference_setting`,
  train.rl.beta, is above 0), and why full fine-tuning cannot train it where it cannot (`full_refusal`);
- how the model card and eval.json describe it (`card`, `reference_words`), with its settings (`settings`: the fields
  of its train subsection, `settings_section`: train.preference or train.rl, and how the card names them).

How it computes (a micro-batch's loss, an optimizer step's normalisation, its evaluation sums) is the trainer's, in
trainer/objectives/. The objective is split along the import rules (docs/architecture.md) rather than held twice:
config/ may not import torch, and config/ and pipeline/ may not import trainer/, which reads this half. So this object
is the key: trainer/objectives/registry.py maps each one (the object, never its name) to its computation, and a test
holds the two registries to the same objectives. A new objective is one entry here and one there; no code compares
an objective's name anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, PlainSerializer, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from config.methods import Method
from config.sections.results import PREFERENCE_METRICS, RL_METRICS, SFT_METRICS, Metric
from config.sections.run_data import SUPERVISED_PREFERENCE, PreferenceMode


@dataclass(frozen=True)
class DataKind:
    """What an objective trains on, as staged: its name in words, the `data.preference` settings that stage it (the
    first is the one an unset data.preference becomes), and whether its rows are preference rows (storage/shards.py:
    a pair or a KTO answer a row, staged by data.preference=pairs) rather than supervised examples."""

    words: str
    preference: tuple[PreferenceMode, ...]
    preference_rows: bool


SUPERVISED_DATA = DataKind("supervised rows", (SUPERVISED_PREFERENCE, "chosen"), preference_rows=False)
PAIR_DATA = DataKind("pairs", ("pairs",), preference_rows=True)
FEEDBACK_DATA = DataKind("KTO feedback (answers labelled true or false)", ("pairs",), preference_rows=True)
# Online RL's prompts, each with the record's other columns (its reference answer) for the reward functions.
PROMPT_DATA = DataKind("prompts (with their reference answers)", ("prompts",), preference_rows=False)


@dataclass(frozen=True)
class Objective:
    """One training objective: its name (train.objective), what it optimises in words, what it trains on, the
    evaluation metrics it reports beside the loss, whether it has a reference model, its settings as the model card
    names them ((label, train.preference field) pairs), and why full fine-tuning cannot train it (None: it can)."""

    name: str
    summary: str
    data: DataKind
    metrics: tuple[Metric, ...]
    reference: bool = False
    settings: tuple[tuple[str, str], ...] = ()
    full_refusal: str | None = None
    settings_section: str = "preference"  # the train subsection its settings are in
    reference_setting: str | None = None  # a setting whose 0 means no reference model (GRPO's beta)
    full_reference: str | None = None  # its reference under full fine-tuning, in words (None: DPO's table)

    def __str__(self) -> str:
        return self.name

    @property
    def gate_metrics(self) -> tuple[Metric, ...]:
        """The metrics a register.gate may compare for it: the loss, which every objective reports, and its own."""
        return ("loss", *self.metrics)

    def settings_of(self, train: object) -> BaseModel:
        """Its settings section of a train section (train.preference, or train.rl)."""
        section = getattr(train, self.settings_section)
        assert isinstance(section, BaseModel), f"train.{self.settings_section} is not a section"
        return section

    def settings_text(self, settings: BaseModel) -> str:
        """Its settings with their values (`beta 0.1, label smoothing 0`); empty for an objective without any."""
        return ", ".join(f"{label} {_shown(getattr(settings, field))}" for label, field in self.settings)

    def has_reference(self, settings: BaseModel | None = None) -> bool:
        """Whether it compares with a reference model under these settings (GRPO: only with beta > 0)."""
        if not self.reference or self.reference_setting is None or settings is None:
            return self.reference
        return float(getattr(settings, self.reference_setting)) > 0

    def card(self, settings: BaseModel, method: Method, model_path: str) -> str:
        """The model card's `objective` row: the objective, its settings and its reference model."""
        head = f"{self.name} ({self.settings_text(settings) or self.summary})"
        if not self.has_reference(settings):
            return head + ("; no reference model" if self.data.preference_rows or self.reference else "")
        if not method.trains_adapters:
            if self.full_reference is not None:
                return f"{head}; reference: the base model `{model_path}`, {self.full_reference}"
            return (
                f"{head}; reference: the base model `{model_path}`'s log-probabilities of every pair, computed before "
                "training (the run's reference/)"
            )
        return f"{head}; reference: the base model `{model_path}` (the adapters disabled)"

    def reference_words(self, method: Method, settings: BaseModel | None = None) -> str | None:
        """The reference model it compared with, in words (eval.json's `reference`); None without one."""
        if not self.has_reference(settings):
            return None
        if not method.trains_adapters:
            if self.full_reference is not None:
                return f"the base model, {self.full_reference}"
            return "the base model's log-probabilities, computed before training (reference/ in the run directory)"
        return f"the base model ({method} adapters disabled)"

    def data_problem(self, preference: PreferenceMode | None) -> str | None:
        """Why an explicit data.preference cannot stage what it trains on (None: it can, or it is unset)."""
        if preference is None or preference in self.data.preference:
            return None
        others = [o.name for o in OBJECTIVES.values() if preference in o.data.preference]
        return (
            f"train.objective={self.name} trains on {self.data.words}, which data.preference={preference} does not "
            f"stage; leave data.preference empty ({self.name} implies {self.data.preference[0]}), set it to "
            f"{either(list(self.data.preference))}, or set train.objective to {either(others)}"
        )

    def gate_problem(self, metric: str) -> str | None:
        """Why a register.gate cannot compare `metric` for it (None: it can)."""
        if metric in self.gate_metrics:
            return None
        return (
            f"register.gate.metric={metric} is not measured for train.objective={self.name}; use loss or one of "
            f"{', '.join(self.metrics)}"
        )

    def method_problem(self, method: Method) -> str | None:
        """Why train.method cannot train it (None: it can)."""
        if not method.trains_adapters and self.full_refusal:
            return f"train.objective={self.name} with train.method={method.name}: {self.full_refusal}"
        return None


def _shown(value: object) -> str:
    """A setting's value on the card: numbers as %g, the rest as they are."""
    return f"{value:g}" if isinstance(value, float | int) and not isinstance(value, bool) else str(value)


def either(names: list[str]) -> str:
    """`a`, `a or b`, `a, b or c`."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


KTO_REFERENCE_POINT = (
    "KTO's reference point compares each answer with another prompt's answer chosen by the batch, which the reference "
    "computed once before full fine-tuning cannot hold; use train.method lora or qlora (the reference is the model "
    "with its adapters disabled), or dpo, ipo or orpo on pairs"
)

SFT = Objective("sft", "supervised: cross-entropy of the answers", SUPERVISED_DATA, SFT_METRICS)
DPO = Objective(
    "dpo",
    "sigmoid loss on pairs, against the reference",
    PAIR_DATA,
    PREFERENCE_METRICS,
    reference=True,
    settings=(("beta", "beta"), ("label smoothing", "label_smoothing")),
)
IPO = Objective(
    "ipo",
    "DPO's squared variant, per token",
    PAIR_DATA,
    PREFERENCE_METRICS,
    reference=True,
    settings=(("tau", "beta"),),
)
KTO = Objective(
    "kto",
    "answers labelled desirable or not, against the reference",
    FEEDBACK_DATA,
    PREFERENCE_METRICS,
    reference=True,
    settings=(("beta", "beta"), ("desirable weight", "desirable_weight"), ("undesirable weight", "undesirable_weight")),
    full_refusal=KTO_REFERENCE_POINT,
)
ORPO = Objective(
    "orpo",
    "chosen answers' cross-entropy and an odds ratio",
    PAIR_DATA,
    PREFERENCE_METRICS,
    settings=(("lambda", "beta"),),
)
GRPO = Objective(
    "grpo",
    "online RL: completions sampled and scored by reward functions, group-relative advantages",
    PROMPT_DATA,
    RL_METRICS,
    reference=True,
    settings=(
        ("group size", "num_generations"),
        ("beta", "beta"),
        ("epsilon", "epsilon"),
        ("epsilon high", "clip_high"),
        ("loss", "loss_type"),
        ("scale rewards", "scale_rewards"),
        ("iterations", "num_iterations"),
        ("temperature", "temperature"),
    ),
    settings_section="rl",
    reference_setting="beta",
    full_reference="a frozen copy loaded beside the policy",
)
# The one map from a name (the command line, a preset, spec.json) to its objective.
OBJECTIVES: dict[str, Objective] = {o.name: o for o in (SFT, DPO, IPO, KTO, ORPO, GRPO)}


def trained_on(data: DataKind) -> list[str]:
    """The names of the objectives that train on `data`, in the registry's order."""
    return [o.name for o in OBJECTIVES.values() if o.data == data]


def objective_named(value: object) -> Objective:
    """train.objective from its name (or an Objective, taken as it is)."""
    if isinstance(value, Objective):
        return value
    if isinstance(value, str) and value in OBJECTIVES:
        return OBJECTIVES[value]
    raise PydanticCustomError(
        "literal_error", "Input should be {expected}", {"expected": either([f"'{name}'" for name in OBJECTIVES])}
    )


# train.objective's type: the object in the config, its name in files, on the command line and in the UI's form.
ObjectiveField = Annotated[
    Objective,
    PlainValidator(objective_named, json_schema_input_type=str),
    PlainSerializer(lambda objective: objective.name, return_type=str),
    WithJsonSchema({"type": "string", "enum": list(OBJECTIVES)}),
]
