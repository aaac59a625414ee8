"""Token shards -> per-rank micro-batches, deterministically from (seed, step) alone.

Every rank computes the same global order; a step takes the next
`micro_batch_size * gradient_accumulation_steps * world_size` examples of it. So the data a step
sees depends only on the step, which makes "resume at step N" exact and node layouts (2 nodes x 1
rank vs 1 node x 2 ranks) equivalent. The order of an epoch is computed once, when a step first needs it (8 bytes
a row), and a step reads only its own rows from the memory-mapped shards (storage/split_reader.py), so a step's data
time does not grow with the dataset.

A unit of the order is a row of the shards: one example, or several packed into one row at prepare time
(`data.packing`); a global batch counts rows either way. Within a step, rows are grouped by length: the
step's rows are sorted by length, cut into micro-batches, and the micro-batches are dealt to ranks so that
padded token counts balance (longest first, to the least-loaded rank). The loss is normalized by the step's
global target-token count, so how rows are dealt to ranks and micro-batches does not change the gradient.

A packed row keeps every example to itself: positions restart at 0 at each boundary and the model is given
those position ids instead of an attention mask, from which Hugging Face's mask builder (transformers'
`masking_utils`, the padding-free format) makes a block-diagonal causal mask, on CPU and GPU alike, with
every attention implementation (flash-attention reads the same position ids as variable-length sequences).
The first label of each example after the first is not a target: it would be predicted from the end of the
previous example. So a packed row's loss is the sum of its examples' losses, as if each ran alone.

With flash-attention's variable-length kernel (trainer/model/attention.py) a micro-batch is one row, its rows
concatenated
without padding (`collate_flat`), and the examples' boundaries (`cu_seqlens`, the longest example) are computed here,
once on the host, and handed to the model with it.
"""

from __future__ import annotations

import array
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from storage.local_dataset import open_split
from storage.node_cache import node_cache
from storage.shards import IGNORE_INDEX, Row
from storage.spec import Spec
from storage.split_reader import ImageSource, Split


def split_of(spec: Spec, split: str) -> Split:
    """A split of the spec's dataset as this rank reads it (in place, or the node cache's copy)."""
    return open_split(spec.dataset_dir, split, node_cache(spec.config.launch), spec.dataset.manifest_digest)


def sample_rows(rows: int, count: int) -> list[int]:
    """`count` row indices spread evenly over a split of `rows` rows (every row when count is 0 or not smaller): the
    rows the trainer's final evaluation uses, so that the exported model can be held to it on the same rows."""
    if count == 0 or count >= rows:
        return list(range(rows))
    return [i * rows // count for i in range(count)]


@dataclass(frozen=True)
class Batch:
    """A padded micro-batch; `position_ids` restart at every example's start when a row holds several. A flattened
    one (`collate_flat`) also carries its examples' boundaries: `cu_seqlens` (int32, the offsets of each example's
    start and of the end) and `max_length` (its longest example's tokens). A vision-language model's (trainer/
    images.py) carries its images' `pixel_values` and `image_grid_thw`, and 3-D `position_ids` always: (3, rows,
    tokens) beside the padding mask, or (4, rows, tokens), text positions first, for packed and flattened rows."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    max_length: int = 0
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None

    @property
    def padded(self) -> bool:
        """Whether the model reads the padding mask (else the positions: packed or flattened rows)."""
        positions = self.position_ids
        return positions is None or (positions.ndim == 3 and positions.shape[0] == 3)

    def model_inputs(self, device: torch.device) -> dict[str, Any]:
        """The forward pass's arguments: the padding mask, or for packed rows the restarting positions alone
        (transformers builds the block-diagonal mask from them only without a mask and without a cache). No key-value
        cache either way: a loss needs none, and with train.compile its per-layer state would recompile every layer."""
        # Copies queued, not waited for (the host tensors are not written again); on the CPU `to` is a no-op.
        inputs: dict[str, Any] = {"input_ids": self.input_ids.to(device, non_blocking=True), "use_cache": False}
        if self.padded:
            inputs["attention_mask"] = self.attention_mask.to(device, non_blocking=True)
        if self.position_ids is not None:
            inputs["position_ids"] = self.position_ids.to(device, non_blocking=True)
        if self.pixel_values is not None and self.image_grid_thw is not None:
            inputs["pixel_values"] = self.pixel_values.to(device, non_blocking=True)
            inputs["image_grid_thw"] = self.image_grid_thw.to(device, non_blocking=True)
        if self.cu_seqlens is not None:
            # transformers' flash-attention path takes these as they are (FlashAttentionKwargs), so no layer reads
            # the boundaries back from the position ids on the device.
            boundaries = self.cu_seqlens.to(device, non_blocking=True)
            inputs |= {"cu_seq_lens_q": boundaries, "cu_seq_lens_k": boundaries}
            inputs |= {"max_length_q": self.max_length, "max_length_k": self.max_length}
        return inputs

    @property
    def target_tokens(self) -> int:
        """Positions that are predicted (labels after the shift, not -100)."""
        return int((self.labels[:, 1:] != IGNORE_INDEX).sum())

    @property
    def padding(self) -> tuple[int, int]:
        """(pad positions, all positions)."""
        return int((self.attention_mask == 0).sum()), self.attention_mask.numel()


def collate(rows: list[Row], pad_id: int) -> Batch:
    """Right-pad to the longest row: pad id for inputs, -100 for labels, 0 in the mask; with packed rows,
    positions restarting at each example (padding: position 0 each, so no token attends to padding)."""
    width = max(len(row.input_ids) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    packed = any(len(row.segments) > 1 for row in rows)
    positions = torch.zeros((len(rows), width), dtype=torch.long) if packed else None
    for index, row in enumerate(rows):
        n = len(row.input_ids)
        ids[index, :n] = torch.tensor(row.input_ids)
        labels[index, :n] = torch.tensor(row.labels)
        mask[index, :n] = 1
        if positions is not None:
            start = 0
            for length in row.segments:
                positions[index, start : start + length] = torch.arange(length)
                if start:
                    labels[index, start] = IGNORE_INDEX  # predicted from the previous example's last token
                start += length
    return Batch(ids, mask, labels, positions)


def collate_flat(rows: list[Row], pad_id: int) -> Batch:
    """The rows concatenated into one row without padding (the padding-free layout of variable-length attention):
    positions restart at every example, an example's first label is not a target, and the examples' boundaries come
    with it. `pad_id` is unused: nothing is padded."""
    del pad_id
    lengths = [length for row in rows for length in row.segments]
    ids = torch.tensor([token for row in rows for token in row.input_ids], dtype=torch.long).unsqueeze(0)
    labels = torch.tensor([label for row in rows for label in row.labels], dtype=torch.long).unsqueeze(0)
    positions = torch.cat([torch.arange(length) for length in lengths]).unsqueeze(0)
    starts = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    labels[0, starts[1:-1].long()] = IGNORE_INDEX  # each predicted from the previous example's last token
    return Batch(ids, torch.ones_like(ids), labels, positions, starts, max(lengths))


@dataclass
class GlobalOrder:
    """The order every rank walks a split's rows in: each epoch a permutation from (seed, epoch) alone, the same as
    `random.Random(seed * 1_000_003 + epoch).shuffle` of the row indices (so the rows of every step, and resumed
    runs, are those of earlier versions), computed once per epoch and kept as 8-byte integers, not Python lists."""

    rows: int
    seed: int
    _epochs: dict[int, array.array[int]] = field(default_factory=dict, repr=False)

    def epoch(self, epoch: int) -> array.array[int]:
        """The epoch's permutation of row indices (the last two epochs asked for are kept: a step may span both)."""
        if epoch not in self._epochs:
            order = array.array("q", range(self.rows))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._epochs = {e: o for e, o in self._epochs.items() if e == epoch - 1} | {epoch: order}
        return self._epochs[epoch]

    def step_indices(self, step: int, per_step: int) -> list[int]:
        """The global row indices consumed by optimizer step `step` (0-based), wrapping across epochs."""
        out: list[int] = []
        position = step * per_step
        while len(out) < per_step:
            epoch, offset = divmod(position, self.rows)
            take = min(per_step - len(out), self.rows - offset)
            out.extend(self.epoch(epoch)[offset : offset + take])
            position += take
        return out


def row_length(rows: Sequence[Row], index: int) -> int:
    """Tokens of a row; a mapped split reads its length column alone."""
    return rows.length(index) if isinstance(rows, Split) else len(rows[index].input_ids)


def deal_by_length(
    indices: list[int], lengths: dict[int, int], micro: int, accum: int, world: int, rotation: int = 0
) -> list[list[list[int]]]:
    """Sort by length, cut into micro-batches, deal them to ranks balancing padded tokens.

    Returns per rank a list of `accum` micro-batches (lists of example indices). Deterministic: ties
    break on index, and on rank order rotated by `rotation` (the step), so that the longest
    micro-batch does not land on rank 0 every step.
    """
    ordered = sorted(indices, key=lambda i: (-lengths[i], i))
    groups = [ordered[start : start + micro] for start in range(0, len(ordered), micro)]
    cost = [len(g) * max(lengths[i] for i in g) for g in groups]
    load = [0] * world
    dealt: list[list[list[int]]] = [[] for _ in range(world)]
    for g in sorted(range(len(groups)), key=lambda k: (-cost[k], k)):
        rank = min((r for r in range(world) if len(dealt[r]) < accum), key=lambda r: (load[r], (r - rotation) % world))
        dealt[rank].append(groups[g])
        load[rank] += cost[g]
    return dealt


class Images(Protocol):
    """What adds a vision-language model's images to a micro-batch (trainer/images.py `ImageInputs`)."""

    def attach(self, batch: Batch, rows: Sequence[Row], source: ImageSource | None) -> Batch:
        """`batch`, collated from `rows`, with their images' pixels and the rows' 3-D positions."""
        ...


@dataclass(frozen=True)
class Dealing:
    """How an optimizer step's rows are dealt: the step (0-based), rows per micro-batch, micro-batches per rank, this
    rank's place among the ranks that read different rows (`rank` of `world`), the pad id, whether rows are
    grouped by length (train.length_grouping), and a vision-language model's images (None: text only)."""

    step: int
    micro: int
    accum: int
    rank: int
    world: int
    pad_id: int
    group_by_length: bool = True
    images: Images | None = None

    def groups(self, rows: Sequence[Row], order: GlobalOrder) -> tuple[list[int], list[list[int]]]:
        """(the step's global row indices, this rank's micro-batches of them); only the step's lengths are read."""
        per_rank = self.micro * self.accum
        indices = order.step_indices(self.step, per_rank * self.world)
        if self.group_by_length:
            lengths = {i: row_length(rows, i) for i in indices}
            mine = deal_by_length(indices, lengths, self.micro, self.accum, self.world, rotation=self.step)
            return indices, mine[self.rank]
        ranks_rows = indices[self.rank * per_rank : (self.rank + 1) * per_rank]
        return indices, [ranks_rows[start : start + self.micro] for start in range(0, per_rank, self.micro)]


def rank_micro_batches(
    rows: Sequence[Row], order: GlobalOrder, dealing: Dealing, *, flat: bool = False
) -> Iterator[Batch]:
    """This rank's micro-batches for the step `dealing` names (`order`: the rows' GlobalOrder); only the step's
    lengths and this rank's rows are read. `flat`: each micro-batch one padding-free row (`collate_flat`)."""
    layout = collate_flat if flat else collate
    for group in dealing.groups(rows, order)[1]:
        yield batch_of([rows[i] for i in group], dealing.pad_id, layout, dealing.images, image_source(rows))


def batch_of(
    rows: list[Row],
    pad_id: int,
    layout: Callable[[list[Row], int], Batch],
    images: Images | None,
    source: ImageSource | None = None,
) -> Batch:
    """The rows collated by `layout` (collate or collate_flat), with their images when the model reads them."""
    batch = layout(rows, pad_id)
    return batch if images is None else images.attach(batch, rows, source)


def image_source(rows: Sequence[Row]) -> ImageSource | None:
    """Where a split's images are read (None for rows that are not a split's, or a dataset without images)."""
    return rows.images if isinstance(rows, Split) else None
