"""Generation as a service: answers to prompts from the model it is given, with no second load: the evaluate stage's
model (`eval.generate`, trainer/evaluation/generate.py), or the model a training run holds (an objective that samples
its own answers while it trains).

Prompts are left-padded into one batch and answered with transformers' `generate` and its key-value cache; each answer
stops at the model's stop tokens and is cut there. At temperature 0 answers are greedy. Otherwise each answer is
drawn with a seed of its own (`seeds`, one per prompt: `row_seed` makes one from any integers, e.g. a run's seed, a
step, a prompt and an answer's index): the token at each position is the argmax of the temperature-scaled, top-p
filtered log-probabilities plus Gumbel noise from that answer's own generator, which is a draw from the same
distribution (the Gumbel-max trick) and makes the noise of an answer independent of the batch it shares, so how
answers are batched and dealt to ranks does not change what is drawn.

`complete` is what a training objective's rollouts take: each completion's tokens with its stop token kept (the model
learns to stop), and whether it ended or ran out of tokens. Under ZeRO-3 a rank holds a share of every weight, and
every forward pass gathers the others' shares, a collective that ranks generating different numbers of tokens could not
keep in step; `whole_weights` gathers the whole model once for a generation phase instead (as TRL does), with
DeepSpeed's per-module hooks taken off meanwhile, so each rank generates alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Sampling:
    """How answers are drawn: at most `max_new_tokens` each; greedy at temperature 0, else sampled at `temperature`
    from the top-p nucleus (`top_p` 1: the whole vocabulary); `repetition_penalty` None takes the model's own
    generation config's."""

    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    repetition_penalty: float | None = None


def row_seed(*parts: int) -> int:
    """A seed from integers (a run's seed, a step, a prompt, an answer), the same in every process."""
    digest = hashlib.blake2b(",".join(str(int(p)) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") & (2**63 - 1)


class GumbelSampler:
    """A logits processor that turns greedy decoding into sampling, one generator per row (see the module's
    docstring): the scores become temperature-scaled log-probabilities, top-p filtered, plus Gumbel noise."""

    def __init__(self, sampling: Sampling, seeds: Sequence[int]) -> None:
        self.sampling = sampling
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        logps = torch.log_softmax(scores.float() / self.sampling.temperature, dim=-1)
        if self.sampling.top_p < 1.0:
            logps = nucleus(logps, self.sampling.top_p)
        vocab = logps.shape[-1]
        uniform = torch.stack([torch.rand(vocab, generator=g, dtype=torch.float64) for g in self.generators])
        # -log(-log(u)), in place: the same operations on the same values as out of place, without four copies of a
        # rows x vocabulary float64 tensor at every token (rollouts sample many rows of a large vocabulary).
        gumbel = uniform.clamp_(min=1e-300).log_().neg_().log_().neg_()
        return logps + gumbel.to(device=logps.device, dtype=logps.dtype)


def nucleus(logps: torch.Tensor, top_p: float) -> torch.Tensor:
    """Log-probabilities with every token outside the smallest set whose probability reaches `top_p` set to -inf
    (the most likely token always kept), as transformers' TopPLogitsWarper filters."""
    ordered, order = torch.sort(logps, descending=False, dim=-1)
    cumulative = ordered.exp().cumsum(dim=-1)
    drop = cumulative <= (1 - top_p)
    drop[..., -1:] = False
    return logps.masked_fill(drop.scatter(-1, order, drop), float("-inf"))


@dataclass(frozen=True)
class Pixels:
    """A batch's images for a vision-language model: their `pixel_values` and `image_grid_thw` (in prompt order), and
    the id of the token each image's run of tokens is made of (what the model's 3-D positions are counted from)."""

    values: torch.Tensor
    grids: torch.Tensor
    image_token: int

    def inputs(self, input_ids: torch.Tensor) -> dict[str, torch.Tensor]:
        """generate's image arguments for these (left-padded) prompts: the processor's token types among them."""
        device = input_ids.device
        types = (input_ids == self.image_token).int()
        return {
            "pixel_values": self.values.to(device),
            "image_grid_thw": self.grids.to(device),
            "mm_token_type_ids": types,
        }


@dataclass(frozen=True)
class Completion:
    """A sampled completion: its tokens, its stop token last when it `ended` (else it reached max_new_tokens)."""

    ids: list[int]
    ended: bool


class Generator:
    """Answers from `model` (any causal LM with transformers' `generate`: a PEFT model, a DeepSpeed engine's module;
    a vision-language model's prompts with their images) padded with `pad_id`, stopping at `stops`."""

    def __init__(self, model: Any, pad_id: int, stops: Sequence[int]) -> None:
        self.model, self.pad_id, self.stops = model, pad_id, sorted(set(stops))

    @classmethod
    def of(cls, model: Any, tokenizer: Any, pad_id: int) -> Generator:
        """A generator stopping where the model's generation config and its tokenizer say an answer ends."""
        return cls(model, pad_id, stop_ids(model, tokenizer))

    @torch.no_grad()
    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: Sampling, seeds: Sequence[int], pixels: Pixels | None = None
    ) -> list[list[int]]:
        """Each prompt's new tokens up to (not including) its first stop token; `seeds`: one per prompt (unused at
        temperature 0); `pixels`: the prompts' images, in order."""
        return [c.ids[:-1] if c.ended else c.ids for c in self.complete(prompts, sampling, seeds, pixels)]

    @torch.no_grad()
    def complete(
        self, prompts: Sequence[Sequence[int]], sampling: Sampling, seeds: Sequence[int], pixels: Pixels | None = None
    ) -> list[Completion]:
        """Each prompt's completion, its first stop token kept; `seeds`: one per prompt (unused at temperature 0);
        `pixels`: the prompts' images, in order."""
        from transformers import GenerationConfig, LogitsProcessorList

        width = max(len(p) for p in prompts)
        device = next(self.model.parameters()).device
        input_ids = torch.tensor([[self.pad_id] * (width - len(p)) + list(p) for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        config: dict[str, Any] = {"max_new_tokens": sampling.max_new_tokens, "do_sample": False}
        if sampling.repetition_penalty is not None:
            config["repetition_penalty"] = sampling.repetition_penalty
        processors = LogitsProcessorList([GumbelSampler(sampling, seeds)] if sampling.temperature > 0 else [])
        out = self.model.generate(
            input_ids=input_ids,
            attention_mask=mask,
            generation_config=GenerationConfig(**config, eos_token_id=self.stops, pad_token_id=self.pad_id),
            logits_processor=processors,
            **(pixels.inputs(input_ids) if pixels is not None else {}),
            # Each rank generates alone (a model whole on every rank, or gathered whole by `whole_weights`): not
            # transformers' ZeRO-3 default, which all-reduces at every token until every rank's answers are done.
            synced_gpus=False,
        )
        answers = []
        for row in out[:, width:].tolist():
            cut = next((i for i, token in enumerate(row) if token in self.stops), None)
            answers.append(Completion(row, False) if cut is None else Completion(row[: cut + 1], True))
        return answers


@contextmanager
def whole_weights(engine: Any, zero3: bool) -> Iterator[Any]:
    """The engine's model for a generation phase, in eval mode: under ZeRO-3 with every weight gathered whole on each
    rank and DeepSpeed's per-module hooks off (a collective: every rank enters it), so that each rank generates alone;
    as it is otherwise."""
    module = getattr(engine, "module", engine)
    training = module.training
    module.eval()
    try:
        if not zero3:
            yield module
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters())):
            offload = engine.optimizer.parameter_offload
            _remove_hooks(offload)
            try:
                yield module
            finally:
                coordinator = getattr(offload, "param_coordinator", None)
                if coordinator is not None and not coordinator.is_invalid_trace():
                    coordinator._invalidate_trace()  # the generation's passes are not the training's trace
                offload._register_deepspeed_module(offload.module)
    finally:
        module.train(training)


def _remove_hooks(offload: Any) -> None:
    """DeepSpeed ZeRO-3's fetch-and-release hooks off every module (TRL's `remove_hooks`)."""
    for _, param in offload.module.named_parameters():
        param.ds_active_sub_modules.clear()
    for hook in [*offload.forward_hooks, *offload.backward_hooks]:
        hook.remove()
    offload.forward_hooks, offload.backward_hooks = [], []


def stop_ids(model: Any, tokenizer: Any) -> list[int]:
    """The model's stop tokens: its generation config's EOS ids and the tokenizer's EOS."""
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = configured if isinstance(configured, list) else [configured]
    return sorted({int(i) for i in [*ids, tokenizer.eos_token_id] if i is not None})
