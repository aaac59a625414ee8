"""The training methods as every layer knows them: full fine-tuning, LoRA and Q-LoRA, each one `Method`, and the one
registry that maps their names to them (`METHODS`). `train.method` holds the object itself, as `train.objective` holds
its objective (config/objectives.py): its name is read once, where the config is validated, and written back where the
config is (spec.json, `--print-config`, the UI form, tracking). What a run records on storage (a checkpoint's
manifest, the registry entry) keeps the name, and is compared through the object it names (`METHODS`).

What the code asks of a method, each question one attribute:

- whether it trains LoRA adapters on a frozen base rather than every weight (`trains_adapters`): what is trained,
  saved, resumed and exported (the adapters, with a merged export beside them), the FLOPs and bytes they cost, and a
  preference objective's reference model (the same model with its adapters disabled, else the base model's
  log-probabilities computed before training);
- whether the frozen base is quantized to 4 bits (`quantizes_base`: nf4 through bitsandbytes), which is what it holds
  in memory and what a rank imports;
- whether ZeRO-3 can partition the base while it loads (`loads_partitioned`): bitsandbytes' 4-bit weights are not;
- the method a checkpoint of it is evaluated with (`evaluated_as`): Q-LoRA's adapters on the full-precision base, as
  its export is.

No code compares a method's name anywhere else (tests/unit/config/test_methods.py holds the code to it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from pydantic import PlainSerializer, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError


@dataclass(frozen=True)
class Method:
    """One training method: its name (train.method), whether it trains LoRA adapters on a frozen base (else every
    weight), and whether that base is quantized to 4 bits (nf4)."""

    name: str
    trains_adapters: bool
    quantizes_base: bool = False

    def __str__(self) -> str:
        return self.name

    @property
    def loads_partitioned(self) -> bool:
        """Whether ZeRO-3 can partition its base while it loads (zero.Init): not bitsandbytes' 4-bit weights."""
        return not self.quantizes_base

    @property
    def evaluated_as(self) -> Method:
        """The method a checkpoint of it is evaluated with: its adapters on the full-precision base, as its export."""
        return LORA if self.trains_adapters else FULL


FULL = Method("full", trains_adapters=False)
LORA = Method("lora", trains_adapters=True)
QLORA = Method("qlora", trains_adapters=True, quantizes_base=True)
# The one map from a name (the command line, a preset, spec.json, a checkpoint's manifest) to its method.
METHODS: dict[str, Method] = {m.name: m for m in (FULL, LORA, QLORA)}


def method_named(value: object) -> Method:
    """train.method from its name (or a Method, taken as it is)."""
    if isinstance(value, Method):
        return value
    if isinstance(value, str) and value in METHODS:
        return METHODS[value]
    expected = [f"'{name}'" for name in METHODS]
    raise PydanticCustomError(
        "literal_error", "Input should be {expected}", {"expected": f"{', '.join(expected[:-1])} or {expected[-1]}"}
    )


# train.method's type: the object in the config, its name in files, on the command line and in the UI's form.
MethodField = Annotated[
    Method,
    PlainValidator(method_named, json_schema_input_type=str),
    PlainSerializer(lambda method: method.name, return_type=str),
    WithJsonSchema({"type": "string", "enum": list(METHODS)}),
]
