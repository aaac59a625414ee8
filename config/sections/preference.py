"""The preference objectives' settings: the `train.preference` section (beta, label smoothing, KTO's weights).

Apart from `train` because the objectives (config/objectives.py) read it to describe themselves, and `train` holds the
objective: one section each way, no cycle.
"""

from __future__ import annotations

from pydantic import Field

from config.sections.base import Section


class PreferenceConfig(Section):
    """The preference objectives' settings (train.objective dpo, ipo, kto, orpo; docs/preference-tuning.md)."""

    beta: float = Field(
        0.1,
        gt=0.0,
        le=100.0,
        description="dpo, ipo, kto: the strength of the pull towards the reference model (DPO's beta; IPO's tau). "
        "orpo: the weight of the odds-ratio term beside the chosen answers' cross-entropy (ORPO's lambda).",
    )
    label_smoothing: float = Field(
        0.0,
        ge=0.0,
        lt=0.5,
        description="dpo: the assumed share of pairs whose preference is flipped (conservative DPO); 0: plain DPO.",
    )
    desirable_weight: float = Field(1.0, gt=0.0, description="kto: the weight of the answers labelled desirable.")
    undesirable_weight: float = Field(1.0, gt=0.0, description="kto: the weight of the answers labelled undesirable.")
