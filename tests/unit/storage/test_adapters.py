"""adapters.json: what a LoRA run adapted, written beside its export and read back for the model card."""

from __future__ import annotations

import json

from storage import layout
from storage.adapters import AdapterSummary, read_adapter_summary
from storage.location import Location


def test_the_summary_round_trips_and_says_what_got_adapters_and_the_share(tmp_path) -> None:
    summary = AdapterSummary(["q_proj", "v_proj"], ["mlp.experts.down_proj"], 1_500, 60_000)
    (tmp_path / layout.ADAPTERS).write_text(json.dumps(summary.to_json()))
    assert read_adapter_summary(Location(str(tmp_path))) == summary
    assert summary.describe() == (
        "adapters on modules q_proj, v_proj; on parameters mlp.experts.down_proj; "
        "1,500 trainable parameters of 60,000 (2.50%)"
    )
    assert "on parameters none" in AdapterSummary(["q_proj"], [], 1, 2).describe()


def test_full_weights_have_no_summary(tmp_path) -> None:
    assert read_adapter_summary(Location(str(tmp_path))) is None
