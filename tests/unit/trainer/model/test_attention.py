"""train.attention (trainer/model/attention.py) and the padding-free layout it takes (trainer/data.py `collate_flat`).

What runs here: the resolution for a device and its one-line refusals, and the numerics of the flattened micro-batch.
The variable-length kernels need a CUDA GPU (tests/gpu/test_attention.py runs them); here `varlen_attention`, the
attention function train.attention=varlen registers with transformers, runs whole but for PyTorch's CUDA kernel, for
which `kernel_stand_in` computes the same thing on the CPU and fails when the boundaries the model was handed
(`cu_seq_lens_q/k`, `max_length_q/k`) are missing or wrong: the host-computed boundaries are what attention uses (a
mock of the GPU kernel alone). Tolerance: losses of the same examples equal within 1e-5 relative (float32; attention's
reductions run over different shapes)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from config.sections.model_train import TrainConfig
from core.errors import EXIT_USER_ERROR, UserError
from storage.shards import IGNORE_INDEX, Row
from trainer.data import Batch, collate, collate_flat
from trainer.loss.chunked import LossHead
from trainer.model import attention
from trainer.model.attention import Attention

CPU = torch.device("cpu")
VARLEN = Attention.VARLEN.value


def kernel_stand_in(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor,
    max_q: int,
    max_k: int,
    scale: float | None,
    window_size: tuple[int, int],
    enable_gqa: bool,
) -> torch.Tensor:
    """What `torch.nn.attention.varlen.varlen_attn` computes (its CUDA kernel does not run on a CPU), checking the
    arguments it is given: (tokens, heads, dim) tensors, causal attention within each example by the boundaries."""
    assert torch.equal(cu_seq_q, cu_seq_k) and cu_seq_q.dtype == torch.int32
    assert int(cu_seq_q[-1]) == query.shape[0], "the boundaries cover the row"
    assert max_q == max_k == int(cu_seq_q.diff().max()) and window_size == (-1, 0)
    assert enable_gqa == (query.shape[1] != key.shape[1])
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    q, k, v = (tensor.transpose(0, 1) for tensor in (query, key, value))  # (heads, tokens, dim)
    parts = [
        F.scaled_dot_product_attention(q[:, a:b], k[:, a:b], v[:, a:b], is_causal=True, scale=scale)
        for a, b in zip(cu_seq_q[:-1].tolist(), cu_seq_q[1:].tolist(), strict=True)
    ]
    return torch.cat(parts, dim=1).transpose(0, 1)


@pytest.fixture(autouse=True)
def _stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention, "varlen_kernel", kernel_stand_in)
    attention.register()


def model_with(implementation: str, family: str = "qwen2") -> Any:
    """A small model (grouped-query attention) with fixed random weights, computing attention by `implementation`."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    shape = {"vocab_size": 96, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2}
    heads = {"num_attention_heads": 4, "num_key_value_heads": 2}
    config, cls = (Qwen2Config, Qwen2ForCausalLM) if family == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    torch.manual_seed(0)
    model = cls._from_config(config(**shape, **heads), attn_implementation=implementation)
    return model.eval()


def rows() -> list[Row]:
    """Three rows, the middle one packed with three examples; labels mask some prompt tokens."""
    generator = torch.Generator().manual_seed(3)

    def tokens(n: int) -> list[int]:
        return torch.randint(1, 96, (n,), generator=generator).tolist()

    first, packed, last = tokens(11), tokens(17), tokens(6)
    return [
        Row(first, [IGNORE_INDEX] * 4 + first[4:], [11]),
        Row(packed, packed[:5] + [IGNORE_INDEX] * 2 + packed[7:], [5, 9, 3]),
        Row(last, last, [6]),
    ]


def example_losses(model: Any, batch: Batch, device: torch.device = CPU) -> list[float]:
    """Each example's summed cross-entropy in `batch`, split at the examples' boundaries (after the shift)."""
    with torch.no_grad():
        logits = model(**batch.model_inputs(device)).logits.float().cpu()
    losses = F.cross_entropy(logits[:, :-1].flatten(0, 1), batch.labels[:, 1:].flatten(), reduction="none")
    # Position t predicts t + 1: a row's losses indexed by the label's position - 1, one more column to keep the width.
    losses = torch.cat([losses.view(logits.shape[0], -1), torch.zeros(logits.shape[0], 1)], dim=1).flatten()
    width = batch.input_ids.shape[1]
    positions = batch.position_ids if batch.position_ids is not None else torch.arange(width).expand_as(batch.input_ids)
    out: list[float] = []
    for row in range(batch.input_ids.shape[0]):
        starts = [t for t in range(width) if positions[row, t] == 0 and batch.attention_mask[row, t]]
        for a, b in zip(starts, [*starts[1:], int(batch.attention_mask[row].sum())], strict=True):
            out.append(float(losses[row * width + a : row * width + b - 1].sum()))
    return out


def test_the_default_is_auto_and_auto_on_a_cpu_is_sdpa() -> None:
    assert TrainConfig().attention == "auto"
    assert attention.resolve("auto", CPU) is Attention.SDPA
    assert attention.resolve("sdpa", torch.device("cuda")) is Attention.SDPA
    assert attention.resolve("flex", torch.device("cuda")) is Attention.FLEX
    assert not Attention.SDPA.varlen and not Attention.FLEX.varlen and Attention.FLASH.varlen


def test_auto_on_cuda_takes_pytorchs_variable_length_attention_for_sft_without_flash_attn() -> None:
    cuda = torch.device("cuda")  # resolution reads the device's type only: no GPU needed
    if attention.flash_missing(cuda) is None:
        pytest.skip("flash-attn is installed here: auto takes it (tests/gpu/test_attention.py)")
    assert attention.resolve("auto", cuda) is Attention.VARLEN
    assert attention.resolve("varlen", cuda) is Attention.VARLEN
    assert attention.resolve("auto", cuda, supervised=False) is Attention.SDPA  # preference rows stay padded
    with pytest.raises(UserError, match=r"^train.attention=varlen cannot run: its kernel needs a CUDA device"):
        attention.resolve("varlen", CPU)
    with pytest.raises(ValueError, match=r"train.attention=varlen with train.objective=dpo: its pairs are not"):
        TrainConfig(attention="varlen", objective="dpo")


def test_the_varlen_attention_without_a_flattened_micro_batch_stops_in_one_line() -> None:
    model = model_with(VARLEN)
    padded = collate(rows(), 0)
    with pytest.raises(UserError, match=r"^train.attention=varlen: the model was called without a flattened"):
        model(input_ids=padded.input_ids, attention_mask=padded.attention_mask, use_cache=False)


def test_auto_splits_sequences_with_sdpa_and_the_config_refuses_flash_with_sequence_parallelism() -> None:
    assert attention.resolve("auto", torch.device("cuda"), sequence_parallel=2) is Attention.SDPA
    with pytest.raises(ValueError, match=r"train.attention=flash with train.sequence_parallel_size=2: DeepSpeed"):
        TrainConfig(attention="flash", sequence_parallel_size=2)


def test_flash_where_it_cannot_run_is_one_line_with_the_fix() -> None:
    for device, why in ((CPU, "its kernels need a CUDA device, and this run's is cpu"), (torch.device("cuda"), None)):
        if why is None and attention.flash_missing(device) is None:
            continue  # flash-attn installed here: the CUDA case is the GPU suite's
        with pytest.raises(UserError) as raised:
            attention.resolve("flash", device)
        message = str(raised.value)
        assert "\n" not in message and raised.value.exit_code == EXIT_USER_ERROR
        assert message.startswith(f"train.attention=flash cannot run: {why or 'the flash-attn package'}")
        assert "set train.attention to auto" in message and "pip install flash-attn" in message


def test_flex_on_a_cpu_is_refused_because_it_has_no_backward_there() -> None:
    with pytest.raises(UserError, match=r"train.attention=flex cannot train on a CPU: .* no backward"):
        attention.resolve("flex", CPU)


def test_a_flattened_micro_batch_is_one_row_without_padding_and_its_boundaries() -> None:
    batch = collate_flat(rows(), pad_id=0)
    assert batch.input_ids.shape == (1, 34) and bool(batch.attention_mask.all())
    assert batch.cu_seqlens is not None and batch.cu_seqlens.tolist() == [0, 11, 16, 25, 28, 34]
    assert batch.cu_seqlens.dtype == torch.int32 and batch.max_length == 11
    assert batch.position_ids is not None and batch.position_ids[0, 9:13].tolist() == [9, 10, 0, 1]
    # Each example's first label is not a target (it would be predicted from the example before); others kept.
    assert [int(batch.labels[0, t]) for t in (11, 16, 25, 28)] == [IGNORE_INDEX] * 4
    padded = collate(rows(), pad_id=0)
    assert batch.target_tokens == padded.target_tokens
    inputs = batch.model_inputs(CPU)
    assert inputs["max_length_q"] == 11 and inputs["cu_seq_lens_q"] is inputs["cu_seq_lens_k"]


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_variable_length_attention_gives_each_example_its_loss_alone(family: str) -> None:
    """The flattened micro-batch through the variable-length stand-in, and through sdpa (the block-diagonal mask
    transformers builds from the position ids), against each example run alone, unpadded."""
    examples = [Row(ids, labels, [n]) for ids, labels, n in split_examples(rows())]
    alone = [example_losses(model_with("sdpa", family), collate([example], 0))[0] for example in examples]
    flat = collate_flat(rows(), pad_id=0)
    assert example_losses(model_with(VARLEN, family), flat) == pytest.approx(alone, rel=1e-5)
    assert example_losses(model_with("sdpa", family), flat) == pytest.approx(alone, rel=1e-5)
    assert example_losses(model_with("sdpa", family), collate(rows(), 0)) == pytest.approx(alone, rel=1e-5)


def split_examples(packed: list[Row]) -> list[tuple[list[int], list[int], int]]:
    """Every example of the rows alone (input ids, labels, length)."""
    out = []
    for row in packed:
        ids, labels, start = row.input_ids, row.labels, 0
        for n in row.segments:
            out.append((list(ids[start : start + n]), list(labels[start : start + n]), n))
            start += n
    return out


def test_the_training_loss_and_its_gradients_are_the_padded_micro_batchs() -> None:
    """The summed loss SFT trains on (the chunked loss head, from the last hidden states) and its gradients: the
    flattened micro-batch through variable-length attention against the padded one through sdpa."""
    results = []
    for implementation, layout in ((VARLEN, collate_flat), ("sdpa", collate)):
        model = model_with(implementation).train()
        head = LossHead.of(model, 8)
        batch = layout(rows(), 0)
        loss = head.summed(model(**batch.model_inputs(CPU), **head.forward_kwargs(CPU)), batch.labels)
        loss.backward()
        results.append((float(loss.detach()), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    (flat_loss, flat_grads), (padded_loss, padded_grads) = results
    assert flat_loss == pytest.approx(padded_loss, rel=1e-5)
    for flat, padded in zip(flat_grads, padded_grads, strict=True):
        assert torch.allclose(flat, padded, atol=1e-5 * float(padded.abs().max()))


def test_sft_deals_flattened_micro_batches_for_variable_length_attention() -> None:
    from trainer.data import Dealing, GlobalOrder
    from trainer.objectives.sft import Sft

    sft = Sft.of(TrainConfig())
    sft.flat = True  # what start sets where the run's choices are variable-length attention (a CUDA device)
    (batch,) = sft.deal(rows(), GlobalOrder(3, 0), Dealing(0, 3, 1, 0, 1, 0, True))  # type: ignore[arg-type]
    assert batch.input_ids.shape == (1, 34) and batch.cu_seqlens is not None and len(batch.cu_seqlens) == 6


def test_sfts_evaluation_of_flattened_rows_gives_the_padded_rows_sums() -> None:
    from trainer.objectives.base import EvalOptions
    from trainer.objectives.sft import EvalRows, local_sums

    options = EvalOptions(2, 0)
    flat = local_sums(model_with(VARLEN), rows(), EvalRows(range(3), 0, 1, flat=True), options, CPU, 8)
    padded = local_sums(model_with("sdpa"), rows(), EvalRows(range(3), 0, 1), options, CPU, 8)
    assert flat[1:] == padded[1:] == (flat[1], flat[2], 5) and flat[1] > 0
    assert flat[0] == pytest.approx(padded[0], rel=1e-5)
