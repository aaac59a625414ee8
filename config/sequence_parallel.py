"""Sequence parallelism's layout, in one place: which ranks split one sequence (a sequence group) and which ranks see
different samples (a data-parallel group), derived from the world size, the ranks per node and
`train.sequence_parallel_size`, and the checks that refuse a layout or a model it cannot split.

DeepSpeed's Ulysses (`deepspeed.runtime.sequence_parallel`) builds its sequence groups from consecutive global ranks,
`[i * size, (i + 1) * size)`, and torchrun numbers ranks node by node, so a size that divides the ranks per node keeps
each sequence group inside one node (its all-to-alls on the node's fast links) and spreads data parallelism across
nodes; a size that is a multiple of the ranks per node spans whole nodes. Any other size would put a group across a
node boundary for some groups and not others: refused. The trainer (trainer/parallel/sequence_parallel.py) holds
DeepSpeed's
groups to this layout, so what is printed at start is what runs.

Ulysses swaps sequence sharding for head sharding around attention, so the attention heads must divide by the size;
key-value heads must divide by it too, or divide it: DeepSpeed then replicates each key-value head size / heads times
(Qwen2.5-7B's 4 key-value heads at size 8: each twice).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    """The ranks of a job as sequence groups x data-parallel groups."""

    world: int
    per_node: int
    size: int  # train.sequence_parallel_size

    @property
    def data_parallel(self) -> int:
        """Ranks that see different samples: one per sequence group."""
        return self.world // self.size

    def data_parallel_rank(self, rank: int) -> int:
        """Which sequence group a rank is in, which is its place among the data-parallel ranks."""
        return rank // self.size

    def sequence_rank(self, rank: int) -> int:
        """A rank's place in its sequence group: which part of each sequence it holds."""
        return rank % self.size

    def sequence_groups(self) -> list[list[int]]:
        """The ranks that split one sequence, per group (consecutive ranks, as DeepSpeed's Ulysses groups them)."""
        return [list(range(start, start + self.size)) for start in range(0, self.world, self.size)]

    def data_parallel_groups(self) -> list[list[int]]:
        """The ranks that hold the same part of different samples, per part of a sequence."""
        return [list(range(part, self.world, self.size)) for part in range(self.size)]

    def describe(self) -> str:
        """The layout as the run's log states it at start."""
        nodes = "inside a node" if self.size <= self.per_node else f"across {self.size // self.per_node} nodes"
        return (
            f"sequence parallelism: {self.world} ranks ({self.per_node} a node) as {self.data_parallel} data-parallel "
            f"x {self.size} sequence-parallel; sequence groups ({nodes}) {_groups(self.sequence_groups())}; "
            f"data-parallel groups {_groups(self.data_parallel_groups())}"
        )


def _groups(groups: list[list[int]]) -> str:
    return " ".join("[" + ",".join(str(rank) for rank in group) + "]" for group in groups)


def layout_problem(size: int, world: int, per_node: int) -> str | None:
    """Why `size` cannot split sequences on `world` ranks of `per_node` a node, as one line with the fix; None if
    it can."""
    if size == 1:
        return None
    if world % size:
        return (
            f"train.sequence_parallel_size={size} does not divide the {world} ranks (launch.nnodes x "
            f"launch.nproc_per_node); use a divisor of {world} ({_divisors(world)})"
        )
    if per_node % size and size % per_node:
        return (
            f"train.sequence_parallel_size={size} neither divides the {per_node} ranks a node nor is a multiple of "
            f"them, so some sequence groups would straddle two nodes; use one of {_divisors(per_node)} (inside a "
            f"node) or a multiple of {per_node} that divides {world}"
        )
    return None


def heads_problem(size: int, heads: int, kv_heads: int) -> str | None:
    """Why Ulysses cannot split a model of `heads` attention heads and `kv_heads` key-value heads `size` ways, as
    one line with the fix; None if it can (key-value heads fewer than `size` and dividing it are replicated)."""
    if size == 1:
        return None
    if heads % size:
        return (
            f"train.sequence_parallel_size={size} does not divide the model's {heads} attention heads (Ulysses gives "
            f"each rank whole heads); use one of {_divisors(heads)}"
        )
    if kv_heads % size and size % kv_heads:
        return (
            f"train.sequence_parallel_size={size} and the model's {kv_heads} key-value heads: neither divides the "
            f"other (DeepSpeed's Ulysses splits them, or replicates them when fewer than the size and dividing it); "
            f"use one of {_divisors(heads)} that {kv_heads} divides or that divides {kv_heads}"
        )
    return None


def kv_replication(size: int, kv_heads: int) -> int:
    """How many times DeepSpeed's Ulysses replicates each key-value head (1: none, they are split)."""
    return max(size // kv_heads, 1)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
