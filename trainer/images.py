"""A vision-language model's images in its micro-batches: each row's staged images read, decoded and cut into patches
by the model's own image processor (its PIL backend: no torchvision), concatenated per micro-batch with their grids
(`pixel_values`, `image_grid_thw`), and the 3-D rotary positions of the rows (trainer/model/mrope.py).

This runs where the rows are batched: in the step prefetch's worker thread (trainer/prefetch.py), one step ahead of
the step that trains on them, so decoding and preprocessing stay off the step's critical path. The images are read
from the dataset as staged (in place, or the node cache's copy: storage/local_dataset.py), never from where the user
kept them, at the pixel settings they were staged with (the manifest's `images`), and each image's grid is held to
the tokens staging counted for it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from config.vision import is_vision_language
from core.errors import UserError
from storage.shards import Row
from storage.split_reader import ImageSource
from trainer.data import Batch
from trainer.model.mrope import rope_positions


@dataclass(frozen=True)
class ImageInputs:
    """What a vision-language model's micro-batches need: its image processor, its image token's id and its merge
    size (a token per merge x merge patches)."""

    processor: Any
    image_token: int
    merge: int

    @classmethod
    def of(cls, model_path: str, config: dict[str, Any]) -> ImageInputs | None:
        """The model's (its directory's preprocessor_config.json), None for a causal LM."""
        if not is_vision_language(config):
            return None
        from transformers import AutoImageProcessor

        try:
            processor = AutoImageProcessor.from_pretrained(model_path, backend="pil")
        except (OSError, ValueError) as exc:
            raise UserError(
                f"model.name_or_path {model_path}: cannot load its image processor ({str(exc).splitlines()[0]}); "
                "the directory needs the published preprocessor_config.json"
            ) from None
        merge = int(config["vision_config"].get("spatial_merge_size", 2))
        return cls(processor, int(config["image_token_id"]), merge)

    def pixels(self, names: Sequence[str], source: ImageSource) -> tuple[torch.Tensor, torch.Tensor]:
        """(pixel_values, image_grid_thw) of staged images, in order, at the pixels they were staged with."""
        import PIL.Image

        images = []
        for name in names:
            with PIL.Image.open(source.folder / name) as opened:
                images.append(opened.convert("RGB"))
        size = {"shortest_edge": source.min_pixels, "longest_edge": source.max_pixels}
        out = self.processor(images=images, size=size, return_tensors="pt")
        return out["pixel_values"], out["image_grid_thw"]

    def attach(self, batch: Batch, rows: Sequence[Row], source: ImageSource | None) -> Batch:
        """`batch` (collated from `rows`) with its images' pixels and grids and its rows' 3-D positions."""
        names = [name for row in rows for name in row.images]
        pixel_values = grids = None
        if names:
            if source is None:
                raise UserError("the rows name images but the dataset lists none; re-stage it")
            pixel_values, grids = self.pixels(names, source)
            check_tokens(grids, [t for row in rows for t in row.image_tokens], self.merge, names)
        if batch.cu_seqlens is not None:  # padding-free: one row of every example
            segments: list[Sequence[int]] = [[n for row in rows for n in row.segments]]
        else:
            segments = [row.segments for row in rows]
        positions = rope_positions(batch.input_ids, segments, grids, batch.position_ids, (self.image_token, self.merge))
        return dataclasses.replace(batch, position_ids=positions, pixel_values=pixel_values, image_grid_thw=grids)


def check_tokens(grids: torch.Tensor, staged: list[int], merge: int, names: Sequence[str]) -> None:
    """Each image's grid gives the tokens staging counted for it (the processor or its settings changed, else)."""
    tokens = (grids.prod(-1) // (merge * merge)).tolist()
    for name, got, expected in zip(names, tokens, staged, strict=True):
        if got != expected:
            raise UserError(
                f"image {name}: the image processor gives {got} tokens, staged with {expected}; the model's "
                "preprocessor_config.json differs from the one the dataset was staged with: prepare the data again"
            )
