"""Where records come from: `data.source` (a file, a directory, a glob or any fsspec URL) expanded into data
files, and readers for JSON arrays, JSON Lines, Parquet and plain text that give every record its exact location:
`path:line` (JSONL and text, 1-based), `path[index]` (JSON array) and `path#row` (Parquet, 0-based).

A `.txt` file is plain text, one example a line, as LLaMA-Factory and `datasets` read it: each non-blank line is
the record `{"text": line}` (without its line end). A directory's data files are its JSON, JSON Lines and Parquet
files; a directory with none of those is read as its `.txt` files (a README.txt beside JSON data is not data).

A JSON or JSON Lines file may be compressed (`.gz`, `.bz2`, `.xz`, `.zst`, told by the extension as fsspec's
`compression="infer"` does): it is read as its content, decompressed as a stream over the same retried block
reads, and its locations count the lines of the content. Digests (staging/identity.py) are of the bytes as
stored.
"""

from __future__ import annotations

import codecs
import io
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import orjson
from fsspec.utils import infer_compression

from core.errors import TandemError, UserError
from storage.fs import filesystem, read_bytes, read_range
from storage.location import Location, is_local
from storage.retry import with_retries

DATA_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet", ".pq")
TEXT_SUFFIX = ".txt"
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")
GLOB_CHARS = "*?["
BLOCK = 8 * 1024 * 1024
BOM = b"\xef\xbb\xbf"
PARQUET_BATCH = 4096
MAX_RECORD_CHARS = 256 * 1024 * 1024  # one element of a JSON array larger than this is taken as malformed
ByteCounter = Callable[[int], None]


@dataclass(frozen=True)
class Unparsable:
    """A record that is not valid JSON; `reason` says why (the reader keeps going)."""

    reason: str


def has_glob(url: str) -> bool:
    """Whether a URL is a glob pattern."""
    return any(char in url for char in GLOB_CHARS)


def _is_data_file(path: str, suffixes: tuple[str, ...] = DATA_SUFFIXES) -> bool:
    name = os.path.basename(path)
    return not name.startswith((".", "_")) and content_name(name).lower().endswith(suffixes)


def is_text_file(url: Location) -> bool:
    """Whether a file is plain text (`.txt`, compressed or not): one example a line."""
    return content_name(url.url).lower().endswith(TEXT_SUFFIX)


def compression(name: str) -> str | None:
    """The stream compression of a file, from its name's extension (gzip, bz2, xz, zstd), or None."""
    found = infer_compression(name) if name.lower().endswith(COMPRESSED_SUFFIXES) else None
    return None if found in (None, "zip") else found


def content_name(name: str) -> str:
    """A file's name without its compression extension: what its content is (`a.jsonl.gz` -> `a.jsonl`)."""
    return name.rsplit(".", 1)[0] if compression(name) else name


def _decompressing(name: str, raw: IO[bytes]) -> IO[bytes]:
    """A reader of the decompressed stream (every member or frame of it, as the command-line tools do)."""
    if name == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    import fsspec.compression

    return fsspec.compression.compr[name](raw, mode="rb")  # gzip, bz2, lzma/xz from the standard library


class _StoredBytes(io.RawIOBase):
    """A stored file read forward, each block one ranged read retried on its own; counts the bytes read."""

    def __init__(self, url: Location, on_bytes: ByteCounter) -> None:
        self.url, self.on_bytes, self.offset = url, on_bytes, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        block = read_range(self.url, self.offset, self.offset + len(buffer))
        buffer[: len(block)] = block
        self.offset += len(block)
        self.on_bytes(len(block))
        return len(block)


def _blocks(url: Location, on_bytes: ByteCounter, size: int | None = None) -> Iterator[bytes]:
    """A file's content in blocks of `size` (default BLOCK; decompressed when it is compressed); `on_bytes` counts
    the bytes read from storage."""
    size = size or BLOCK
    name = compression(url.url)
    if name is None:
        offset = 0
        while block := read_range(url, offset, offset + size):
            offset += len(block)
            on_bytes(len(block))
            yield block
        return
    with _decompressing(name, io.BufferedReader(_StoredBytes(url, on_bytes), BLOCK)) as stream:
        while True:
            try:
                block = stream.read(size)
            except TandemError:
                raise
            except Exception as exc:  # noqa: BLE001 - each codec has its own errors (BadGzipFile, LZMAError, ZstdError)
                raise UserError(f"{url}: not a readable {name} file ({exc}); check the file or its extension") from None
            if not block:
                return
            yield block


def content(url: Location, on_bytes: ByteCounter = lambda _: None) -> bytes:
    """A file's whole content, decompressed when it is compressed."""
    if compression(url.url) is None:
        body = read_bytes(url)
        on_bytes(len(body))
        return body
    return b"".join(_blocks(url, on_bytes))


def expand(source: Location, key: str) -> list[Location]:
    """The data files of a source, sorted, each reached with the source's options; a UserError naming `key` when
    there are none."""
    fs, path = filesystem(source)
    kind, files = with_retries("list", source, lambda: _listing(fs, path, has_glob(source.url)))
    if kind == "glob" and not files:
        raise UserError(f"{key}: {source} matches no file; check the pattern")
    if kind == "dir" and not files:
        raise UserError(
            f"{key}: directory {source} holds no {'/'.join((*DATA_SUFFIXES, TEXT_SUFFIX))} files (compressed or not)"
        )
    if kind == "missing":
        raise UserError(f"{key}: {source} does not exist; give an existing file, directory, glob or URL")
    return [source.with_url(p if is_local(source) else fs.unstrip_protocol(p)) for p in sorted(files)]


def _listing(fs: object, path: str, glob: bool) -> tuple[str, list[str]]:
    """(glob|dir|file|missing, data files): one attempt at listing a source."""
    if glob:
        found = fs.glob(path, detail=True)  # type: ignore[attr-defined]
        return "glob", [p for p, info in found.items() if info["type"] == "file"]
    if fs.isdir(path):  # type: ignore[attr-defined]
        found = fs.find(path)  # type: ignore[attr-defined]
        return "dir", [p for p in found if _is_data_file(p)] or [p for p in found if _is_data_file(p, (TEXT_SUFFIX,))]
    if fs.exists(path):  # type: ignore[attr-defined]
        return "file", [path]
    return "missing", []


def file_kind(url: Location) -> str:
    """jsonl, json (an array), parquet or text: from the suffix (of the content), else from the first bytes."""
    lower = content_name(url.url).lower()
    if lower.endswith(TEXT_SUFFIX):
        return "text"
    if lower.endswith((".parquet", ".pq")):
        return "parquet"
    if lower.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    head = next(_blocks(url, lambda _: None, size=64 * 1024), b"")
    if head.startswith(b"PAR1"):
        return "parquet"
    return "json" if head.removeprefix(BOM).lstrip()[:1] == b"[" else "jsonl"


def read_file(url: Location, on_bytes: ByteCounter) -> Iterator[tuple[str, object]]:
    """(location, parsed record or Unparsable) for every record of a data file, in file order."""
    kind = file_kind(url)
    if kind == "parquet" and compression(url.url):
        raise UserError(
            f"{url}: a compressed Parquet file; Parquet compresses its own columns, so store it "
            "uncompressed (or give JSON Lines)"
        )
    if kind == "parquet":
        return _read_parquet(url, on_bytes)
    if kind == "json":
        return _read_json_array(url, on_bytes)
    if kind == "text":
        return _read_text(url, on_bytes)
    return _read_jsonl(url, on_bytes)


def _lines(url: Location, on_bytes: ByteCounter) -> Iterator[bytes]:
    """The lines of a file (without the newline), read in large blocks: fast on local disks and object stores.
    Each block is one ranged read, retried on its own after a transient storage fault."""
    rest = b""
    for block in _blocks(url, on_bytes):
        lines = (rest + block).split(b"\n")
        rest = lines.pop()
        yield from lines
    if rest:
        yield rest


def parse_line(url: Location, lineno: int, line: bytes) -> tuple[str, object] | None:
    """(location, parsed record or Unparsable) of one line of a JSON Lines file; None for a blank line."""
    if lineno == 1:
        line = line.removeprefix(BOM)
    if not line.strip():
        return None
    try:
        return f"{url}:{lineno}", orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return f"{url}:{lineno}", Unparsable(f"malformed JSON ({exc.msg}, column {exc.colno})")


def _read_jsonl(url: Location, on_bytes: ByteCounter) -> Iterator[tuple[str, object]]:
    parsed_any = False
    for lineno, line in enumerate(_lines(url, on_bytes), start=1):
        item = parse_line(url, lineno, line)
        if item is None:
            continue
        if isinstance(item[1], Unparsable) and not parsed_any:
            _refuse_single_document(url)
        parsed_any = parsed_any or not isinstance(item[1], Unparsable)
        yield item


def _read_text(url: Location, on_bytes: ByteCounter) -> Iterator[tuple[str, object]]:
    """Each non-blank line of a text file as `{"text": line}`, without its line end (LF or CRLF)."""
    for lineno, line in enumerate(_lines(url, on_bytes), start=1):
        if lineno == 1:
            line = line.removeprefix(BOM)
        if not line.strip():
            continue
        try:
            yield f"{url}:{lineno}", {"text": line.removesuffix(b"\r").decode("utf-8")}
        except UnicodeDecodeError as exc:
            yield f"{url}:{lineno}", Unparsable(f"not UTF-8 text (byte {exc.start + 1} of the line)")


def _refuse_single_document(url: Location) -> None:
    """A file that is one JSON document over several lines is not JSON Lines: say so, not 'malformed line 1'."""
    try:
        doc = orjson.loads(content(url).removeprefix(BOM))
    except orjson.JSONDecodeError:
        return
    raise UserError(
        f"{url}: expected a JSON array of records or JSON Lines, got one JSON {type(doc).__name__} over several lines"
    )


def _read_json_array(url: Location, on_bytes: ByteCounter) -> Iterator[tuple[str, object]]:
    """The records of a JSON array, parsed one at a time as the file streams in, so that the file is never in memory
    whole (LLaMA-Factory's sets are JSON arrays of up to millions of records)."""
    stream = _ArrayText(url, on_bytes)
    stream.expect_start()
    index = 0
    while (record := stream.next_element()) is not _END:
        yield f"{url}[{index}]", record
        index += 1


_END = object()  # the end of a JSON array
_WHITESPACE = " \t\n\r"


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


class _ArrayText:
    """The decoded text of a JSON array file, read block by block, and a cursor over its elements; every error names
    the line (and column) in the file."""

    def __init__(self, url: Location, on_bytes: ByteCounter) -> None:
        self.url = url
        self._blocks = _blocks(url, on_bytes)
        self._decode = codecs.getincrementaldecoder("utf-8")()
        self._decoder = json.JSONDecoder(parse_constant=_no_constant)  # NaN/Infinity, as orjson refuses them
        self.text, self.pos, self.eof = "", 0, False
        self.lines_before = 0  # lines of the file before the text held
        self.columns_before = 0  # characters of the text's first line before the text held

    def _more(self) -> bool:
        """Append the next block's text (dropping what was consumed); False at the end of the file."""
        if self.eof:
            return False
        newlines = self.text.count("\n", 0, self.pos)
        if newlines:
            self.lines_before += newlines
            self.columns_before = self.pos - self.text.rfind("\n", 0, self.pos) - 1
        else:
            self.columns_before += self.pos
        self.text, self.pos = self.text[self.pos :], 0
        try:
            block = next(self._blocks, None)
            self.text += self._decode.decode(block or b"", final=block is None)
        except UnicodeDecodeError as exc:
            raise UserError(f"{self.url}: not UTF-8 text ({exc.reason}); save the file as UTF-8") from None
        self.eof = block is None
        return True

    def _skip_space(self) -> str:
        """The next character that is not whitespace ('' at the end of the file)."""
        while True:
            while self.pos < len(self.text) and self.text[self.pos] in _WHITESPACE:
                self.pos += 1
            if self.pos < len(self.text) or not self._more():
                return self.text[self.pos : self.pos + 1]

    def fail(self, reason: str, pos: int | None = None) -> UserError:
        """The one-line error for malformed JSON at `pos` (default: the cursor)."""
        at = self.pos if pos is None else pos
        newlines = self.text.count("\n", 0, at)
        column = at - self.text.rfind("\n", 0, at) if newlines else self.columns_before + at + 1
        line = self.lines_before + newlines + 1
        return UserError(f"{self.url}:{line}: malformed JSON ({reason}, column {column}); fix the file")

    def expect_start(self) -> None:
        """Past the BOM and the opening bracket."""
        self._more()
        self.text = self.text.removeprefix("\ufeff")
        if self._skip_space() != "[":
            raise UserError(f"{self.url}: expected a JSON array of records or JSON Lines")
        self.pos += 1

    def next_element(self) -> object:
        """The next element of the array, or _END after its closing bracket."""
        if self._skip_space() == "]":
            self.pos += 1
            if self._skip_space():
                raise self.fail("extra data after the array")
            return _END
        while True:
            try:
                element, self.pos = self._decoder.raw_decode(self.text, self.pos)
                break
            except json.JSONDecodeError as exc:
                # An element cut by the end of the text read so far parses once more is read.
                if len(self.text) - self.pos > MAX_RECORD_CHARS or not self._more():
                    raise self.fail(exc.msg, exc.pos) from None
            except ValueError as exc:
                raise self.fail(str(exc)) from None
        separator = self._skip_space()
        if separator == ",":
            self.pos += 1
            if self._skip_space() == "]":
                raise self.fail("a comma before the closing bracket")
        elif separator != "]":
            raise self.fail("expected ',' or ']' after an element" if separator else "the array is not closed")
        return element


def _read_parquet(url: Location, on_bytes: ByteCounter) -> Iterator[tuple[str, object]]:
    import pyarrow.parquet as pq

    fs, path = filesystem(url)
    size = fs.size(path)
    with fs.open(path, "rb") as handle:
        try:
            parquet = pq.ParquetFile(handle)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid/OSError for anything not Parquet
            raise UserError(f"{url}: not a readable Parquet file ({exc})") from None
        total = max(parquet.metadata.num_rows, 1)
        row = reported = 0
        for batch in parquet.iter_batches(batch_size=PARQUET_BATCH):
            for record in batch.to_pylist():
                yield f"{url}#{row}", record
                row += 1
            done = size * row // total
            on_bytes(done - reported)
            reported = done
