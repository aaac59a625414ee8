"""A vision-language model as staging uses it: how many tokens each image becomes, and each `<image>` placeholder
expanded into them, as the model's own processor expands `<|image_pad|>` (LLaMA-Factory's mm_plugin for Qwen2-VL
does the same): `<|vision_start|>`, one `<|image_pad|>` per merge x merge patches of the image's grid at
data.image_min_pixels / data.image_max_pixels, `<|vision_end|>`.

So a staged row holds every token the model sees: lengths, data.max_length and data.excess_length, packing and the
memory plan count the images' tokens as they count text. The image tokens stand in the prompt, so they are never
targets. A window of data.max_length tokens that would cut an image, or leave one out, is not taken: the record is
dropped and counted instead (its images and their tokens must stay one for one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from config.sections.run_data import DataConfig
from config.vision import (
    IMAGE_PLACEHOLDER,
    PREPROCESSOR_CONFIG,
    Patches,
    grid_tokens,
    image_grid,
    is_vision_language,
    unsupported,
)
from core.errors import UserError
from staging.formats import Conversation, InvalidRecord
from storage.shards import ExampleImages

# The model config's keys naming the three tokens an image becomes.
TOKEN_KEYS = ("vision_start_token_id", "image_token_id", "vision_end_token_id")
NO_IMAGES: ExampleImages = ((), ())


@dataclass(frozen=True)
class Vision:
    """What staging needs of a vision-language model (picklable, for the tokenizing processes): its processor's
    patches, data.image_min_pixels and data.image_max_pixels, and the ids of the tokens an image becomes."""

    patches: Patches
    min_pixels: int
    max_pixels: int
    start_id: int
    pad_id: int
    end_id: int

    def tokens(self, image: dict[str, Any]) -> int:
        """`<|image_pad|>` tokens of one staged image (its record entry: width and height)."""
        grid = image_grid(int(image["height"]), int(image["width"]), self.patches, self.min_pixels, self.max_pixels)
        return grid_tokens(grid, self.patches)

    def describe(self) -> dict[str, int]:
        """What decides an image's tokens (the dataset id and the manifest's `images`)."""
        return {
            "patch_size": self.patches.patch,
            "merge_size": self.patches.merge,
            "min_pixels": self.min_pixels,
            "max_pixels": self.max_pixels,
        }


def vision_of(model_path: str, model: dict[str, Any] | None, data: DataConfig) -> Vision | None:
    """The staging view of a vision-language model (`model`: its config.json), None for a text-only model; a
    UserError for one Tandem does not train or a directory without its processor's config."""
    if model is None or not is_vision_language(model):
        return None
    if (why := unsupported(model)) is not None:
        raise UserError(f"model.name_or_path {model_path}: {why}")
    path = Path(model_path) / PREPROCESSOR_CONFIG
    try:
        preprocessor = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UserError(
            f"model.name_or_path {model_path}: a vision-language model (config.json has a vision_config) without a "
            f"readable {PREPROCESSOR_CONFIG}; copy the published model's processor files into the directory"
        ) from None
    try:
        ids = [int(model[key]) for key in TOKEN_KEYS]
    except (KeyError, TypeError, ValueError):
        raise UserError(
            f"model.name_or_path {model_path}: config.json lacks {' or '.join(TOKEN_KEYS)}; the published "
            "Qwen2.5-VL and Qwen3-VL configs carry them"
        ) from None
    return Vision(Patches.of(preprocessor), data.image_min_pixels, data.image_max_pixels, *ids)


def image_texts(tokenizer: Any, vision: Vision | None) -> tuple[str, str, str]:
    """The text of the start, pad and end tokens an image is expanded to (empty for a text-only model)."""
    if vision is None:
        return "", "", ""
    start, pad, end = (str(tokenizer.convert_ids_to_tokens(i)) for i in (vision.start_id, vision.pad_id, vision.end_id))
    return start, pad, end


def expand(
    conversation: Conversation, vision: Vision | None, texts: tuple[str, str, str]
) -> tuple[Conversation, ExampleImages]:
    """The conversation with each `<image>` replaced by its image's tokens (`texts`: the start, pad and end tokens'
    text), and its images' names and pad tokens, in order."""
    if vision is None:  # staging/records.py refuses image records for a text-only model before this
        raise InvalidRecord("a record with images, for a text-only model")
    counts = [vision.tokens(image) for image in conversation["images"]]
    start, pad, end = texts
    pending = iter(counts)
    messages = []
    for message in conversation["messages"]:
        content = message.get("content")
        if isinstance(content, str) and IMAGE_PLACEHOLDER in content:
            pieces = content.split(IMAGE_PLACEHOLDER)
            content = pieces[0] + "".join(f"{start}{pad * next(pending)}{end}{piece}" for piece in pieces[1:])
            message = {**message, "content": content}
        messages.append(message)
    names = tuple(image["name"] for image in conversation["images"])
    return {**conversation, "messages": messages}, (names, tuple(counts))


def image_runs(ids: np.ndarray, vision: Vision | None, pictures: ExampleImages) -> list[tuple[int, int]]:
    """[start, stop) of each image's tokens in an encoded row (runs of pad tokens), held to what was expanded: a
    tokenizer that merged or split them would put the images' features on the wrong tokens."""
    if vision is None or not pictures[0]:
        return []
    is_pad = np.concatenate(([0], (ids == vision.pad_id).astype(np.int8), [0]))
    edges = np.flatnonzero(np.diff(is_pad))
    runs = list(zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True))
    if [stop - start for start, stop in runs] != list(pictures[1]):
        raise UserError(
            f"the tokenizer encoded the images' tokens as runs of {[stop - start for start, stop in runs]}, not "
            f"{list(pictures[1])}; its <|image_pad|> must be one special token"
        )
    return runs


def keeps_images(runs: list[tuple[int, int]], first: int, stop: int) -> bool:
    """Whether a window [first, stop) of a row keeps every image's tokens whole."""
    return all(first <= start and end <= stop for start, end in runs)


def cut_reason(n_tokens: int, runs: list[tuple[int, int]], max_length: int) -> str:
    """Why a record with images is dropped rather than truncated."""
    image_tokens = sum(stop - start for start, stop in runs)
    return (
        f"{n_tokens} tokens ({image_tokens} of them its {len(runs)} image{'s' if len(runs) > 1 else ''}'), longer "
        f"than data.max_length={max_length}, and a shorter window would cut an image; raise data.max_length or lower "
        "data.image_max_pixels"
    )
