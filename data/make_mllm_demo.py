"""Regenerate data/mllm_demo/: an image conversation set in LLaMA-Factory's `mllm_demo` layout, for vision-language
models (docs/vision.md).

    python data/make_mllm_demo.py

Written for this project: six small pictures of one coloured shape each (drawn here, five PNGs and one JPEG), and 24
conversations about them in LLaMA-Factory's multimodal ShareGPT form: `messages` with `<image>` placeholders, an
`images` list of paths relative to the data file, and a `dataset_info.json` entry whose `columns.images` names them.
Each picture is asked about four times (its shape, its colour, a two-turn description, and beside the next picture),
so the 24 records name 6 distinct images. Deterministic: the same bytes on every machine.
"""

from __future__ import annotations

import json
from pathlib import Path

OUT = Path(__file__).resolve().parent / "mllm_demo"
IMAGES = "mllm_demo_data"
# (file, width, height, colour name, RGB, shape): the sizes differ, so the images' grids (and tokens) differ.
PICTURES = [
    ("1.png", 112, 112, "red", (220, 30, 30), "circle"),
    ("2.png", 140, 84, "blue", (30, 60, 220), "square"),
    ("3.png", 84, 140, "green", (30, 170, 60), "triangle"),
    ("4.jpg", 168, 112, "yellow", (240, 210, 20), "diamond"),
    ("5.png", 98, 98, "purple", (140, 40, 170), "ring"),
    ("6.png", 126, 126, "orange", (250, 140, 20), "cross"),
]
DATASET_INFO = {
    "mllm_demo": {
        "file_name": "mllm_demo.json",
        "formatting": "sharegpt",
        "columns": {"messages": "messages", "images": "images"},
        "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
    }
}


def draw(width: int, height: int, rgb: tuple[int, int, int], shape: str) -> object:
    """One picture: a shape of one colour, centred on white."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), (255, 255, 255))
    pen = ImageDraw.Draw(image)
    side = min(width, height)
    x0, y0 = (width - side) // 2 + side // 6, (height - side) // 2 + side // 6
    x1, y1 = x0 + 2 * side // 3, y0 + 2 * side // 3
    middle_x, middle_y = (x0 + x1) // 2, (y0 + y1) // 2
    if shape == "circle":
        pen.ellipse((x0, y0, x1, y1), fill=rgb)
    elif shape == "square":
        pen.rectangle((x0, y0, x1, y1), fill=rgb)
    elif shape == "triangle":
        pen.polygon([(middle_x, y0), (x1, y1), (x0, y1)], fill=rgb)
    elif shape == "diamond":
        pen.polygon([(middle_x, y0), (x1, middle_y), (middle_x, y1), (x0, middle_y)], fill=rgb)
    elif shape == "ring":
        pen.ellipse((x0, y0, x1, y1), outline=rgb, width=max(side // 10, 2))
    else:
        bar = side // 8
        pen.rectangle((middle_x - bar, y0, middle_x + bar, y1), fill=rgb)
        pen.rectangle((x0, middle_y - bar, x1, middle_y + bar), fill=rgb)
    return image


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def records() -> list[dict[str, object]]:
    """Four conversations per picture (see the module docstring)."""
    out: list[dict[str, object]] = []
    for index, (name, _, _, colour, _, shape) in enumerate(PICTURES):
        path = f"{IMAGES}/{name}"
        following = PICTURES[(index + 1) % len(PICTURES)]
        out += [
            {"messages": [user("<image>What shape is in the picture?"), assistant(f"A {shape}.")], "images": [path]},
            {"messages": [user("What colour is the shape?<image>"), assistant(f"It is {colour}.")], "images": [path]},
            {
                "messages": [
                    user("<image>Describe the picture."),
                    assistant(f"A {colour} {shape} on a white background."),
                    user("How many shapes are there?"),
                    assistant("One."),
                ],
                "images": [path],
            },
            {
                "messages": [
                    user("<image><image>Do these two pictures show the same shape?"),
                    assistant(f"No: the first shows a {colour} {shape}, the second a {following[3]} {following[5]}."),
                ],
                "images": [path, f"{IMAGES}/{following[0]}"],
            },
        ]
    return out


def main() -> None:
    """Write the pictures, the records and dataset_info.json under data/mllm_demo/."""
    (OUT / IMAGES).mkdir(parents=True, exist_ok=True)
    for name, width, height, _, rgb, shape in PICTURES:
        image = draw(width, height, rgb, shape)
        options = {"quality": 90} if name.endswith(".jpg") else {"optimize": True}
        image.save(OUT / IMAGES / name, **options)  # type: ignore[attr-defined]
    (OUT / "mllm_demo.json").write_text(json.dumps(records(), indent=2) + "\n")
    (OUT / "dataset_info.json").write_text(json.dumps(DATASET_INFO, indent=2) + "\n")


if __name__ == "__main__":
    main()
