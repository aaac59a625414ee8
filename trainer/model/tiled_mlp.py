"""train.tiled_mlp: each decoder layer's dense MLP computed a tile of the sequence at a time (Arctic Long Sequence
Training's tiled MLP, DeepSpeed's `TiledMLP`), so that its intermediate tensors exist for one tile only.

A dense MLP (Qwen2, Qwen3, Llama: down(act(gate(x)) * up(x))) keeps four intermediate-size tensors per token for
backward: at Qwen2.5-0.5B's shape (intermediate 4,864, hidden 896) 22 times what its input takes. DeepSpeed's
`TiledMLP` saves only the input and recomputes each tile's MLP in backward, one tile at a time, the adapter's or the
weights' gradients added up over the tiles (DeepSpeed is told to reduce them after the last one). The price is the
MLP's forward computed twice (three times with gradient checkpointing). Tiles are ALST's: about `hidden_size`
tokens each, ceil(tokens / hidden_size) of them.

Under ZeRO-3 every rank must fetch the partitioned weights as many times as the others (each fetch is a collective),
so the ranks agree on the largest tile count of the call (DeepSpeed's own recipe: one all-reduce per layer and
call); elsewhere each rank takes its own. Mixture-of-experts blocks are left as they are (not dense MLPs).
"""

from __future__ import annotations

import logging
import math
import types
from typing import Any

import torch

log = logging.getLogger(__name__)


def dense_mlp(module: Any) -> bool:
    """A dense gated MLP (gate_proj, up_proj, down_proj): Qwen2MLP, Qwen3MLP, LlamaMLP, Liger's SwiGLU MLP."""
    return all(hasattr(module, name) for name in ("gate_proj", "up_proj", "down_proj"))


def tile_count(tokens: int, hidden: int) -> int:
    """ALST's tiles: about `hidden` tokens each."""
    return max(1, math.ceil(tokens / hidden))


def partitioned(module: Any) -> bool:
    """The module's weights are ZeRO-3 partitions (fetched by a collective at each use)."""
    return any(hasattr(parameter, "ds_id") for parameter in module.parameters())


def agreed(tiles: int, device: torch.device) -> int:
    """The largest tile count among the ranks (every rank calls: ZeRO-3 needs the same number of fetches)."""
    import torch.distributed as tdist

    if not tdist.is_initialized() or tdist.get_world_size() == 1:
        return tiles
    count = torch.tensor([tiles], device=device)
    tdist.all_reduce(count, op=tdist.ReduceOp.MAX)
    return int(count.item())


def tiled_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
    """The MLP's forward through DeepSpeed's TiledMLP (bound to each dense MLP by `tile_mlps`)."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP

    tiles = tile_count(x.shape[-2], x.shape[-1])
    if self._tandem_partitioned is None:  # known once DeepSpeed has wrapped the model (its first forward)
        self._tandem_partitioned = partitioned(self)
    if self._tandem_partitioned:
        tiles = agreed(tiles, x.device)
    if tiles == 1 and not self._tandem_partitioned:
        return self._tandem_forward(x)
    trainable = [parameter for parameter in self.parameters() if parameter.requires_grad]
    return TiledMLP.apply(lambda mlp, part: mlp._tandem_forward(part), self, x, tiles, trainable)


def tile_mlps(model: Any) -> int:
    """Bind the tiled forward to every dense MLP of `model` (in place: parameter names unchanged); how many."""
    count = 0
    for module in model.modules():
        if dense_mlp(module) and not hasattr(module, "_tandem_forward"):
            module._tandem_forward = module.forward  # the class's own forward, bound
            module._tandem_partitioned = None
            module.forward = types.MethodType(tiled_forward, module)
            count += 1
    if count:
        log.info("train.tiled_mlp: %d dense MLPs computed in tiles of about hidden_size tokens", count)
    else:
        log.warning("train.tiled_mlp: no dense MLP (gate_proj, up_proj, down_proj) in %s", type(model).__name__)
    return count
