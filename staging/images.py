"""The images of vision-language records: each one found, decoded and digested as its record is read, and copied onto
storage under its digest once the dataset is named.

A record's images are LLaMA-Factory's: an `images` list (LLaVA's single `image`, OpenAI's `image`/`image_url`
content parts become one), each a path relative to the data file's folder (or an absolute path or URL), one per
`<image>` placeholder in the turns' text, in order. At staging each image must exist, decode (Pillow), convert to
RGB and have an aspect ratio Qwen's processor accepts; the placeholders must match the images one for one and stand
in the prompt, never in an answer. The record then names each image by its content, `{digest}.{ext}` (the digest in
data.digest_algorithm, the extension from the decoded format) with its pixel size, so the record's digest, the
dataset id and everything after them depend on the images' bytes, never on where the user keeps them.

The staged copy (`copy_images`): one file per distinct image under `{dataset}/images/`, read again from its
source, held against the digest its name carries, and written atomically; the manifest lists each with its size and
digest like a shard. Every node reads that copy (or its node cache's), never the user's path.
"""

from __future__ import annotations

import io
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from config.vision import IMAGE_PLACEHOLDER, MAX_ASPECT_RATIO
from core.errors import UserError
from staging.formats import Conversation, InvalidRecord, type_name
from staging.progress import Reporter
from staging.vision import Vision
from storage.digest import digest_bytes, digest_url
from storage.fs import read_bytes, write_bytes_atomic
from storage.layout import IMAGE_DATASET_SCHEMA, IMAGES, image_path
from storage.location import Location, is_local, join, local_path
from storage.node_cache import cache_root, file_digest

# Pillow's format names that are not their usual file extension.
EXTENSIONS = {"jpeg": "jpg", "mpo": "jpg", "tiff": "tif"}
COPY_THREADS = 8  # images copied at once onto storage (each read, digested and written on its own)
CACHE_ENTRIES = 4096  # local images remembered per process by path, size and modification time


IMAGE_PARTS = ("image", "image_url")  # OpenAI's and Qwen's content parts that hold an image


@dataclass(frozen=True)
class StagedImage:
    """An image as a staged record names it: `name` ({digest}.{ext}), its pixel size, and (not in the record's
    canonical form) where it was read from and its bytes."""

    name: str
    width: int
    height: int
    source: str
    size: int

    def reference(self) -> dict[str, Any]:
        """The record's entry for this image: what its digest covers."""
        return {"name": self.name, "width": self.width, "height": self.height}


def lift_image_parts(record: object) -> object:
    """A record whose messages' content parts hold images (OpenAI's `{"type": "image_url", "image_url": {"url"}}`,
    Qwen's `{"type": "image", "image": path}`, LLaMA-Factory v1's `{"type": "image", "value": path}`), as
    LLaMA-Factory's form: each image part an `<image>` placeholder joined to the text beside it (as Qwen's template
    renders parts: nothing between them), and the images in an `images` list. Other records pass unchanged."""
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        return record
    found: list[object] = []
    messages = [_lift(message, found) for message in record["messages"]]
    if not found:
        return record
    if "images" in record:
        raise InvalidRecord("images given both as content parts and as an images list; give them one way")
    return {**record, "messages": messages, "images": found}


def _lift(message: object, found: list[object]) -> object:
    """One message with its image parts as placeholders (their images appended to `found`)."""
    if not isinstance(message, dict):
        return message
    parts = message.get("content")
    if not isinstance(parts, list) or not any(isinstance(p, dict) and p.get("type") in IMAGE_PARTS for p in parts):
        return message
    out: list[object] = []
    pending = ""  # placeholders waiting for the next text part
    for part in parts:
        if isinstance(part, dict) and part.get("type") in IMAGE_PARTS:
            value = part.get(part["type"], part.get("value"))
            found.append(value.get("url") if isinstance(value, dict) else value)
            pending += IMAGE_PLACEHOLDER
        elif isinstance(part, dict) and part.get("type") == "text" and pending:
            out.append(joined(part, pending, before=True))
            pending = ""
        else:
            out.append(part)
    if pending:
        texts = [i for i, part in enumerate(out) if isinstance(part, dict) and part.get("type") == "text"]
        if texts:
            last = out[texts[-1]]
            assert isinstance(last, dict)  # a text part, found above
            out[texts[-1]] = joined(last, pending, before=False)
        else:
            out.append({"type": "text", "text": pending})
    return {**message, "content": out}


def joined(part: dict[str, Any], placeholders: str, *, before: bool) -> dict[str, Any]:
    """A text part (OpenAI's `text`, LLaMA-Factory v1's `value`) with placeholders before or after its text."""
    key = "value" if "value" in part else "text"
    text = str(part.get(key) or "")
    return {**part, key: placeholders + text if before else text + placeholders}


def with_images(conversation: Conversation, record: object) -> Conversation:
    """The normalized conversation with the record's raw images (its `images` list, or LLaVA's `image`), if any."""
    if not isinstance(record, dict):
        return conversation
    images = record.get("images", record.get("image"))
    if images is None or images == []:
        return conversation
    if "text" in conversation:
        raise InvalidRecord("a plain-text record (format text) cannot hold images; give it as a conversation")
    return {**conversation, "images": images}


def placeholders(conversation: Conversation) -> int:
    """`<image>` placeholders in a conversation's turns."""
    return sum(str(m.get("content") or "").count(IMAGE_PLACEHOLDER) for m in conversation.get("messages", []))


def check_placeholders(conversation: Conversation, images: int) -> None:
    """The placeholders match the images one for one, and stand in the prompt (a system, user or tool turn)."""
    count = placeholders(conversation)
    if count != images:
        if not images:
            raise InvalidRecord(
                f"the turns hold {count} {IMAGE_PLACEHOLDER} placeholder{'s' if count > 1 else ''} but the record has "
                "no images (column images); give the images (LLaMA-Factory's columns.images) or remove the "
                "placeholders"
            )
        raise InvalidRecord(
            f"the turns hold {count} {IMAGE_PLACEHOLDER} placeholder{'s' if count != 1 else ''} but the record has "
            f"{images} image{'s' if images != 1 else ''}; put one {IMAGE_PLACEHOLDER} in the text where each image "
            "stands, in the order of the images"
        )
    for index, message in enumerate(conversation.get("messages", [])):
        if message.get("role") == "assistant" and IMAGE_PLACEHOLDER in str(message.get("content") or ""):
            raise InvalidRecord(
                f"turn {index} (assistant) holds an {IMAGE_PLACEHOLDER} placeholder; images belong to the prompt "
                "(a user turn): an answer's tokens are targets"
            )


def image_paths(value: object) -> list[str]:
    """The paths of a record's `images` value: a list of strings (or of {"path": ...} objects), or one string."""
    items = value if isinstance(value, list) else [value]
    paths = []
    for index, item in enumerate(items):
        path = item.get("path") if isinstance(item, dict) else item
        if not isinstance(path, str) or not path.strip():
            raise InvalidRecord(f"images[{index}]: expected a path (a string), got {type_name(item)}")
        paths.append(path)
    return paths


def source_of(path: str, folder: Location) -> Location:
    """Where an image path points: a URL or absolute path as it is, else relative to the data file's folder."""
    if "://" in path or os.path.isabs(path):
        return folder.with_url(path)
    return join(folder, path)


class ImageReader:
    """Reads, decodes and digests the images records name (`algorithm`: data.digest_algorithm); local files already
    read by this process (same path, size and modification time) are not decoded again."""

    def __init__(self, algorithm: str) -> None:
        self.algorithm = algorithm
        self._known: dict[tuple[str, int, int], StagedImage] = {}

    def resolve(self, conversation: Conversation, folder: Location) -> tuple[Conversation, dict[str, Location]]:
        """The conversation with its images read and named by content, and where each named image was read;
        InvalidRecord for an image that is missing, does not decode, or does not match the placeholders."""
        raw = conversation.get("images")
        if raw is None:
            check_placeholders(conversation, 0)
            return conversation, {}
        paths = image_paths(raw)
        check_placeholders(conversation, len(paths))
        images = [self.read(path, folder, index) for index, path in enumerate(paths)]
        sources = {image.name: folder.with_url(image.source) for image in images}
        return {**conversation, "images": [image.reference() for image in images]}, sources

    def read(self, path: str, folder: Location, index: int) -> StagedImage:
        """One image, checked and named (see the module's docstring)."""
        where = source_of(path, folder)
        key = self._key(where)
        if key is not None and key in self._known:
            return self._known[key]
        try:
            data = read_bytes(where)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise InvalidRecord(
                f"images[{index}]: {where} does not exist (paths are relative to the data file)"
            ) from None
        image = self.decode(data, where, index)
        if key is not None:
            if len(self._known) >= CACHE_ENTRIES:
                self._known.clear()
            self._known[key] = image
        return image

    def decode(self, data: bytes, where: Location, index: int) -> StagedImage:
        """An image's bytes decoded, converted to RGB and named by their digest."""
        import PIL.Image

        try:
            with PIL.Image.open(io.BytesIO(data)) as opened:
                opened.load()
                kind = (opened.format or "").lower()
                width, height = opened.convert("RGB").size
        except (OSError, ValueError, SyntaxError, PIL.Image.DecompressionBombError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise InvalidRecord(f"images[{index}]: {where} is not an image Pillow can decode ({reason})") from None
        if max(width, height) > MAX_ASPECT_RATIO * min(width, height):
            raise InvalidRecord(
                f"images[{index}]: {where} is {width}x{height} pixels, an aspect ratio over {MAX_ASPECT_RATIO} that "
                "Qwen's image processor refuses; crop or pad it"
            )
        name = f"{digest_bytes(data, self.algorithm)}.{EXTENSIONS.get(kind, kind) or 'img'}"
        return StagedImage(name, width, height, str(where), len(data))

    @staticmethod
    def _key(where: Location) -> tuple[str, int, int] | None:
        if not is_local(where):
            return None
        try:
            stat = os.stat(local_path(where))
        except OSError:
            return None
        return local_path(where), stat.st_size, stat.st_mtime_ns


def image_names(conversation: Conversation) -> list[str]:
    """The names of a staged conversation's images, in order."""
    return [image["name"] for image in conversation.get("images", [])]


@dataclass(frozen=True)
class StagedImages:
    """A dataset's staged images: their manifest entries, and how their tokens were counted (None: no images)."""

    files: list[dict[str, Any]]
    settings: dict[str, int] | None = None

    def manifest(self) -> dict[str, Any]:
        """What the manifest adds for them: the schema of a dataset with images and its `images` summary."""
        if self.settings is None:
            return {}
        summary = {"count": len(self.files), "bytes": sum(f["size"] for f in self.files), **self.settings}
        return {"schema": IMAGE_DATASET_SCHEMA, "images": summary}


def stage_images(
    sources: dict[str, Location], base: Location, vision: Vision | None, algorithm: str, reporter: Reporter
) -> StagedImages:
    """Copy the records' images into the dataset (`copy_images`), saying how many; nothing without images."""
    if not sources or vision is None:
        return StagedImages([])
    files = copy_images(sources, base, algorithm)
    size = sum(entry["size"] for entry in files)
    reporter.info(f"{len(files)} distinct images ({size / 1e6:.1f} MB) copied to {join(base, IMAGES)}")
    return StagedImages(files, vision.describe())


def changed_source(manifest: dict[str, Any], options: Any) -> str | None:
    """The first image of a staged dataset whose source no longer holds the bytes it was staged from (missing, or
    another digest), None when every one does: a data file unchanged may name images that changed, which the source
    key (a digest of the data files) cannot see. Local sources are digested through the node cache's digests (once
    per file version), others read again (`options`: data.storage_options)."""
    algorithm = manifest["digest_algorithm"]
    for entry in manifest["files"]:
        source = entry.get("source")
        if source is None or not entry["path"].startswith(f"{IMAGES}/"):
            continue
        where = Location(source, options)
        try:
            if is_local(where):
                digest = file_digest(local_path(where), algorithm, cache_root())[0]
            else:
                digest = digest_url(where, algorithm)[0]
        except OSError:  # missing, or unreadable: not the bytes staged
            return source
        if digest != entry["digest"]:
            return source
    return None


def copy_images(sources: dict[str, Location], base: Location, algorithm: str) -> list[dict[str, Any]]:
    """Copy each distinct image (`sources`: name -> where it was read) to `{base}/images/{name}`, each held against
    the digest its name carries; returns their manifest entries, in name order."""

    def copy(name: str) -> dict[str, Any]:
        source = sources[name]
        data = read_bytes(source)
        digest = digest_bytes(data, algorithm)
        if not name.startswith(f"{digest}."):
            raise UserError(
                f"{source}: the image changed while it was staged ({algorithm} {digest}, staged as {name}); "
                "stage again once the images are settled"
            )
        path = image_path(name)
        write_bytes_atomic(join(base, path), data)
        # `source`: where it was staged from (what a person knows it by: the model card's sample answers).
        return {"path": path, "size": len(data), "digest": digest, "source": str(source)}

    names = sorted(sources)
    with ThreadPoolExecutor(max_workers=COPY_THREADS, thread_name_prefix="images") as pool:
        return list(pool.map(copy, names))


_READERS: dict[str, ImageReader] = {}


def image_reader(algorithm: str) -> ImageReader:
    """This process's reader of images named in `algorithm` (its cache lives as long as the process)."""
    if algorithm not in _READERS:
        _READERS[algorithm] = ImageReader(algorithm)
    return _READERS[algorithm]
