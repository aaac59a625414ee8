"""Qwen2.5-VL's and Qwen3-VL's 3-D rotary positions (multimodal RoPE), computed on the host for every layout a
micro-batch takes, exactly as the model's own `get_rope_index` computes them for images.

Along an example, a text token's three positions are equal and count up by one; an image's tokens (its grid of
t x h/merge x w/merge merged patches) take the position reached before it plus their temporal, row and column index,
and the text after the image goes on from that position plus the larger of its merged height and width. Each example
starts at 0: a packed row (several examples, `segments`) and a padding-free one (`collate_flat`) restart at every
boundary, as their text positions do.

The model computes these itself only for a padded batch and only when given the processor's `mm_token_type_ids`;
without them it would silently give every token text positions. So the trainer always hands them over: for a padded
batch as (3, rows, tokens) beside the attention mask (padding at 0, as the model leaves it), for a packed or
padding-free one as (4, rows, tokens), the text positions first, from which transformers builds the block-diagonal
mask, as it does for a text model's packed rows.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from core.errors import UserError


def vision_positions(grid: Sequence[int], start: int, merge: int) -> torch.Tensor:
    """(3, tokens) positions of one image's tokens placed after position `start` (get_vision_position_ids: time,
    then row, then column, the column fastest)."""
    t, h, w = (int(v) for v in grid)
    rows, columns = h // merge, w // merge
    temporal = torch.arange(t).repeat_interleave(rows * columns)
    height = torch.arange(rows).repeat_interleave(columns).repeat(t)
    width = torch.arange(columns).repeat(t * rows)
    return torch.stack([temporal, height, width]) + start


def example_positions(ids: torch.Tensor, grids: Iterator[Sequence[int]], image_token: int, merge: int) -> torch.Tensor:
    """(3, len(ids)) positions of one example's tokens; each run of image tokens takes the next grid."""
    is_image = (ids == image_token).tolist()
    parts: list[torch.Tensor] = []
    position, index, length = 0, 0, len(is_image)
    while index < length:
        if not is_image[index]:
            stop = next((i for i in range(index, length) if is_image[i]), length)
            parts.append(torch.arange(stop - index).expand(3, -1) + position)
            position += stop - index
            index = stop
            continue
        grid = next(grids, None)
        if grid is None:
            raise UserError("a micro-batch holds more runs of image tokens than images; re-stage the dataset")
        image = vision_positions(grid, position, merge)
        run = next((i for i in range(index, length) if not is_image[i]), length) - index
        if run != image.shape[1]:
            raise UserError(
                f"an image of grid {list(grid)} is {image.shape[1]} tokens, not as many as its run in the row; the "
                "image processor and the staged dataset disagree (re-stage it for this model)"
            )
        parts.append(image)
        position += max(int(grid[1]), int(grid[2])) // merge
        index += image.shape[1]
    return torch.cat(parts, dim=1) if parts else torch.zeros(3, 0, dtype=torch.long)


def rope_positions(
    input_ids: torch.Tensor,
    segments: Sequence[Sequence[int]],
    grids: torch.Tensor | None,
    text_positions: torch.Tensor | None,
    token_merge: tuple[int, int],
) -> torch.Tensor:
    """The position ids of a micro-batch for a vision-language model (`segments`: each row's examples' lengths,
    padding after them; `grids`: the image_grid_thw of its images in row order; `token_merge`: the image token's id
    and the spatial merge size). `text_positions` (a packed or padding-free micro-batch's, restarting at every
    example) come first when given: (4, rows, tokens); else (3, rows, tokens)."""
    image_token, merge = token_merge
    out = torch.zeros(3, *input_ids.shape, dtype=torch.long)
    pending = iter(grids.tolist() if grids is not None else [])
    for row, lengths in enumerate(segments):
        start = 0
        for length in lengths:
            ids = input_ids[row, start : start + length]
            out[:, row, start : start + length] = example_positions(ids, pending, image_token, merge)
            start += length
    if next(pending, None) is not None:
        raise UserError("a micro-batch holds fewer runs of image tokens than images; re-stage the dataset")
    if text_positions is None:
        return out
    return torch.cat([text_positions.unsqueeze(0), out])
