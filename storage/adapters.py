"""`adapters.json`, beside an exported LoRA adapter ({run}/final): which modules and parameters got adapters and the
trainable share of the model, as the run's log said, for the model card."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from storage import layout
from storage.fs import exists, read_json
from storage.location import Location, join


@dataclass(frozen=True)
class AdapterSummary:
    """What a LoRA run adapted: the module names, the parameter names, and the trainable share of the model."""

    target_modules: list[str]
    target_parameters: list[str]
    trainable: int
    total: int

    def describe(self) -> str:
        """One line for the run's log and the model card."""
        share = 100 * self.trainable / self.total if self.total else 0.0
        parameters = ", ".join(self.target_parameters) or "none"
        return (
            f"adapters on modules {', '.join(self.target_modules) or 'none'}; on parameters {parameters}; "
            f"{self.trainable:,} trainable parameters of {self.total:,} ({share:.2f}%)"
        )

    def to_json(self) -> dict[str, Any]:
        """The summary as adapters.json holds it."""
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> AdapterSummary:
        """The summary read back from adapters.json."""
        return cls(
            list(doc["target_modules"]), list(doc["target_parameters"]), int(doc["trainable"]), int(doc["total"])
        )


def read_adapter_summary(final: Location) -> AdapterSummary | None:
    """The summary beside an exported adapter ({run}/final/adapters.json); None for full weights or an export from
    before the file existed."""
    path = join(final, layout.ADAPTERS)
    return AdapterSummary.from_json(read_json(path)) if exists(path) else None
