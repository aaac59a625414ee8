"""trainer/model/mrope.py: the 3-D rotary positions the trainer hands a vision-language model, against the model's own
`get_rope_index` for padded rows, and a packed row's examples each exactly as alone, in the model's own loss."""

from __future__ import annotations

import pytest
import torch

from core.errors import UserError
from trainer.model.mrope import rope_positions, vision_positions

GRIDS = torch.tensor([[1, 4, 6], [1, 6, 2], [1, 2, 2]])


def load(path: str):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()


def image(token: int, grid: torch.Tensor, merge: int = 2) -> list[int]:
    return [token] * (int(grid.prod()) // merge**2)


def rows(token: int) -> tuple[list[int], list[int]]:
    """Two rows: text, an image, text, an image, text; and text, an image, text (vision start 1, end 2)."""
    first = [5, 6, 1, *image(token, GRIDS[0]), 2, 7, 8, 9, 1, *image(token, GRIDS[1]), 2, 3]
    return first, [4, 1, *image(token, GRIDS[2]), 2, 10, 11]


@pytest.mark.parametrize("family", ["qwen25_vl", "qwen3_vl"])
def test_padded_rows_take_the_models_own_positions(family: str, request: pytest.FixtureRequest) -> None:
    model = load(request.getfixturevalue(family))
    token, merge = model.config.image_token_id, model.config.vision_config.spatial_merge_size
    first, second = rows(token)
    ids = torch.zeros(2, len(first), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for index, row in enumerate((first, second)):
        ids[index, : len(row)], mask[index, : len(row)] = torch.tensor(row), 1
    theirs, _ = model.model.get_rope_index(ids, (ids == token).int(), image_grid_thw=GRIDS, attention_mask=mask)
    ours = rope_positions(ids, [[len(first)], [len(second)]], GRIDS, None, (token, merge))
    assert torch.equal(ours, theirs)


def test_a_packed_rows_examples_restart_and_the_text_positions_come_first() -> None:
    token = 99
    first, second = rows(token)
    ids = torch.tensor([first + second])
    text = torch.cat([torch.arange(len(first)), torch.arange(len(second))]).unsqueeze(0)
    packed = rope_positions(ids, [[len(first), len(second)]], GRIDS, text, (token, 2))
    alone = [
        rope_positions(torch.tensor([r]), [[len(r)]], grids, None, (token, 2))
        for r, grids in ((first, GRIDS[:2]), (second, GRIDS[2:]))
    ]
    assert packed.shape == (4, 1, len(first) + len(second)) and torch.equal(packed[0], text)
    assert torch.equal(packed[1:], torch.cat(alone, dim=2))


def test_an_images_positions_follow_its_grid_and_mismatches_are_one_line() -> None:
    assert vision_positions([1, 4, 6], 10, 2).tolist() == [
        [10] * 6,
        [10, 10, 10, 11, 11, 11],
        [10, 11, 12, 10, 11, 12],
    ]
    ids = torch.tensor([[5, 99, 99, 6]])
    with pytest.raises(UserError, match="more runs of image tokens than images"):
        rope_positions(ids, [[4]], None, None, (99, 2))
    with pytest.raises(UserError, match=r"an image of grid \[1, 2, 2\] is 1 tokens, not as many as its run"):
        rope_positions(ids, [[4]], torch.tensor([[1, 2, 2]]), None, (99, 2))
    with pytest.raises(UserError, match="fewer runs of image tokens than images"):
        rope_positions(ids, [[4]], torch.tensor([[1, 2, 4], [1, 2, 2]]), None, (99, 2))


def test_a_packed_rows_loss_is_its_examples_losses_alone(qwen25_vl: str) -> None:
    """The positions and the block-diagonal mask from them keep every example to itself: the model's summed loss over
    one packed row equals the sum over its examples run one by one."""
    model = load(qwen25_vl)
    token, merge = model.config.image_token_id, model.config.vision_config.spatial_merge_size
    first, second = rows(token)
    torch.manual_seed(0)
    patch = 3 * 2 * 14 * 14
    pixels = [torch.randn(int(g.prod()), patch) for g in GRIDS]

    def loss(ids: list[int], grids: torch.Tensor, values: list[torch.Tensor], segments: list[int]) -> torch.Tensor:
        row = torch.tensor([ids])
        text = torch.cat([torch.arange(n) for n in segments]).unsqueeze(0) if len(segments) > 1 else None
        positions = rope_positions(row, [segments], grids, text, (token, merge))
        labels = row.clone()
        labels[0, torch.tensor(segments[:-1], dtype=torch.long).cumsum(0)] = -100  # no prediction across examples
        # As the trainer hands them (trainer/data.py Batch.model_inputs): no cache, so packed rows are detected.
        inputs = {"position_ids": positions} | ({} if text is not None else {"attention_mask": torch.ones_like(row)})
        out = model(input_ids=row, pixel_values=torch.cat(values), image_grid_thw=grids, use_cache=False, **inputs)
        logits, targets = out.logits[0, :-1], labels[0, 1:]
        return torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, reduction="sum")

    with torch.no_grad():
        packed = loss(first + second, GRIDS, pixels, [len(first), len(second)])
        alone = loss(first, GRIDS[:2], pixels[:2], [len(first)]) + loss(second, GRIDS[2:], pixels[2:], [len(second)])
    assert torch.allclose(packed, alone, rtol=1e-5)
