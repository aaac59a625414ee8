"""The choices a run's build makes once for this rank's device, before the model loads, and hands on as one value:
the kernels (train.kernels), the attention (train.attention), the precision and the ZeRO stage. The model's load,
the objective (its loss head, its micro-batches' layout) and the evaluation read them; none resolves them again."""

from __future__ import annotations

from dataclasses import dataclass

from config.deepspeed import zero_stage
from config.footprint import read_model_json
from config.objectives import SUPERVISED_DATA
from config.vision import is_vision_language
from core.errors import UserError
from storage.spec import Spec
from trainer.model.attention import Attention
from trainer.model.attention import resolve as resolve_attention
from trainer.model.kernels import Kernels
from trainer.model.kernels import resolve as resolve_kernels
from trainer.parallel.distributed import Dist


@dataclass(frozen=True)
class Choices:
    """What the run computes with on this rank (see the module's docstring)."""

    kernels: Kernels
    attention: Attention
    bf16: bool  # bf16 on a GPU, float32 on a CPU
    zero_stage: int

    @property
    def liger(self) -> bool:
        """Whether Liger's kernels (and its fused loss, for SFT) are applied."""
        return self.kernels is Kernels.LIGER

    @property
    def flat(self) -> bool:
        """Whether a supervised micro-batch is one padding-free row with its examples' boundaries (variable-length
        attention: trainer/data.py `collate_flat`)."""
        return self.attention.varlen

    @property
    def zero3(self) -> bool:
        """Whether parameters are partitioned (ZeRO-3): every forward pass is a collective."""
        return self.zero_stage == 3

    @property
    def load_attention(self) -> str | None:
        """transformers' attn_implementation to load the model with; None for its default, sdpa (a model whose own
        code has no sdpa path falls back to eager there)."""
        return None if self.attention is Attention.SDPA else self.attention.value


def resolve(spec: Spec, dist: Dist) -> Choices:
    """The run's choices on this rank's device: a kernel or an attention that cannot run here stops the run now, in
    one line, before the model loads. Preference objectives never flatten their pairs, so `auto` attention takes the
    variable-length path for supervised rows only."""
    train = spec.config.train
    kernels = resolve_kernels(train.kernels, dist.device)
    supervised = train.objective.data == SUPERVISED_DATA
    if is_vision_language(read_model_json(spec.model_path) or {}):
        return Choices(
            kernels, vision_attention(train.attention, dist), dist.device.type == "cuda", zero_stage(spec.deepspeed)
        )
    attention = resolve_attention(train.attention, dist.device, dist.sequence_parallel, supervised=supervised)
    return Choices(kernels, attention, dist.device.type == "cuda", zero_stage(spec.deepspeed))


def vision_attention(setting: str, dist: Dist) -> Attention:
    """A vision-language model's attention: sdpa, its micro-batches padded (packed rows keep their examples apart by
    their positions). The padding-free layout hands the examples' boundaries to every attention call of the model, the
    vision tower's windows too, and sequence parallelism would split an image's tokens: both refused in one line."""
    if dist.sequence_parallel > 1:
        raise UserError(
            "train.sequence_parallel_size > 1 with a vision-language model: splitting a row would split its images' "
            "tokens from their features; set train.sequence_parallel_size=1"
        )
    if setting in ("flash", "varlen", "flex"):
        raise UserError(
            f"train.attention={setting} with a vision-language model: its padding-free micro-batches would hand the "
            "text's boundaries to the vision tower's attention too; set train.attention to auto or sdpa (padded)"
        )
    return resolve_attention("sdpa", dist.device)
