"""The shard writer: examples in, shards of at most shard_rows rows out, each listed with the size and digest of the
bytes written, its counts (records, rows, tokens, predicted targets) as the manifest records them; packed and
preference rows keep their segments."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from storage.digest import digest_bytes
from storage.location import Location
from storage.shards import IGNORE_INDEX, PAIR, PreferenceWriter, SplitWriter, examples_of, row, split_rows
from storage.split_reader import Shard

N = IGNORE_INDEX  # not a target


def flat(*examples: tuple[list[int], list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = np.array([t for ex in examples for t in ex[0]], dtype=np.int32)
    labels = np.array([t for ex in examples for t in ex[1]], dtype=np.int32)
    return ids, labels, np.array([len(ex[0]) for ex in examples], dtype=np.int64)


def test_rows_go_to_shards_of_at_most_shard_rows_each_listed_with_its_digest(tmp_path) -> None:
    written: list[dict] = []
    writer = SplitWriter(Location(str(tmp_path)), "train", 2, "blake3", written.append)
    examples = [([1, 2, 3], [N, 2, 3]), ([4, 5], [N, 5]), ([6, 7, 8, 9], [N, N, 8, 9]), ([10], [10])]
    ids, labels, lengths = flat(*examples)
    writer.add(ids, labels, lengths, np.array([False, True, False, False]))
    files = writer.close()
    assert [f["path"] for f in files] == ["train/shard-00000.arrow", "train/shard-00001.arrow"] and written == files
    for entry in files:
        data = (tmp_path / entry["path"]).read_bytes()
        assert (entry["size"], entry["digest"]) == (len(data), digest_bytes(data, "blake3"))
    # Targets are predicted positions: an example's first label is never predicted (the 10 of the last one).
    assert writer.counts == {"records": 4, "rows": 4, "tokens": 10, "target_tokens": 5, "truncated": 1}
    rows = [Shard(tmp_path / f["path"]).row(i) for f in files for i in range(2)]
    assert [(r.input_ids, r.labels, r.segments) for r in rows] == [(a, b, [len(a)]) for a, b in examples]


def test_a_packed_row_keeps_its_examples_apart(tmp_path) -> None:
    writer = SplitWriter(Location(str(tmp_path)), "train", 10, "sha256", lambda _: None, packed=True)
    ids, labels, lengths = flat(([1, 2], [N, 2]), ([3, 4, 5], [N, 4, 5]), ([6], [6]))
    writer.add(ids, labels, lengths, np.zeros(3, dtype=bool), sizes=np.array([2, 1]))
    [entry] = writer.close()
    shard = Shard(tmp_path / entry["path"])
    packed = shard.row(0)
    assert (packed.input_ids, packed.segments) == ([1, 2, 3, 4, 5], [2, 3])
    assert examples_of([packed, shard.row(1)]) == [
        row([1, 2], [N, 2]),
        row([3, 4, 5], [N, 4, 5]),
        row([6], [6]),
    ]
    assert writer.counts["rows"] == 2 and writer.counts["records"] == 3


def test_preference_rows_keep_their_segments_and_labels(tmp_path) -> None:
    writer = PreferenceWriter(Location(str(tmp_path)), "train", 10, "blake3", lambda _: None)
    # A pair (prompt 2, chosen 2, rejected 1) and a KTO answer labelled undesirable (prompt 1, answer 2).
    ids = np.array([1, 2, 3, 4, 5, 6, 7, 8], dtype=np.int32)
    labels = np.array([N, N, 3, 4, 5, N, 7, 8], dtype=np.int32)
    segments = np.array([[2, 2, 1], [1, 2, 0]])
    writer.add_rows(ids, labels, segments, np.array([PAIR, 0]), np.zeros(2, dtype=bool))
    [entry] = writer.close()
    shard = Shard(Path(tmp_path) / entry["path"])
    assert shard.row(0).segments == [2, 2, 1] and shard.row(1).segments == [1, 2, 0]
    assert shard.feedback is not None and shard.feedback.tolist() == [PAIR, 0]
    assert {k: writer.counts[k] for k in ("pairs", "desirable", "undesirable", "target_tokens")} == {
        "pairs": 1,
        "desirable": 0,
        "undesirable": 1,
        "target_tokens": 5,
    }


def test_a_manifest_from_before_packing_counts_one_row_per_record() -> None:
    assert split_rows({"records": 10}) == 10 and split_rows({"records": 10, "rows": 4}) == 4


def test_a_rows_images_and_their_tokens_travel_with_it_packed_or_not(tmp_path) -> None:
    """A dataset with images: each row names its images (their staged names) and tokens, a packed row its examples'
    in order, and a packed row's examples get back their own (one run of the image token per image)."""
    image = 7  # the image token of this test
    writer = SplitWriter(Location(str(tmp_path)), "train", 10, "blake3", lambda _: None, packed=True, images=True)
    examples = (([1, image, image, 2], [N, N, N, 2]), ([3, 4], [N, 4]), ([5, image, 6, image, image, 8], [N] * 5 + [8]))
    ids, labels, lengths = flat(*examples)
    pictures = [(("a.png",), (2,)), ((), ()), (("b.jpg", "a.png"), (1, 2))]
    writer.add(ids, labels, lengths, np.zeros(3, dtype=bool), sizes=np.array([2, 1]), images=pictures)
    [entry] = writer.close()
    assert writer.counts["images"] == 3 and writer.counts["image_tokens"] == 5
    shard = Shard(tmp_path / entry["path"])
    first, second = shard.row(0), shard.row(1)
    assert (first.images, first.image_tokens) == (["a.png"], [2])
    assert (second.images, second.image_tokens) == (["b.jpg", "a.png"], [1, 2])
    alone = examples_of([first, second], image)
    assert [(e.images, e.image_tokens) for e in alone] == [(["a.png"], [2]), ([], []), (["b.jpg", "a.png"], [1, 2])]
    plain = SplitWriter(Location(str(tmp_path / "plain")), "train", 10, "blake3", lambda _: None)
    assert "images" not in plain.schema.names and "images" not in plain.counts  # a text dataset's shards as before
