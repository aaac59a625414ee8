"""train.compile: regional compilation, each decoder layer compiled on its own, as PyTorch's recipe recommends for
repeated blocks (torch.compile's "regional compilation"): the layers share one shape, so the first compiles and the
others reuse its code, and compilation takes seconds where the whole model's took minutes. The rest of the model (the
embedding, the final norm, the loss) stays eager.

Inductor's and Triton's caches live in the node cache (`compile/` under launch.node_cache_dir, storage/node_cache.py),
so a second run on the node compiles nothing it compiled before. Compilation happens at the first forward pass: the
run logs the first optimizer step's time as the compile time (trainer/loop.py).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from storage.node_cache import COMPILE

log = logging.getLogger(__name__)

# Where torch's inductor and Triton keep what they compiled: the environment variables they read, and the node cache's
# subdirectory for each.
CACHE_DIRS = {"TORCHINDUCTOR_CACHE_DIR": "inductor", "TRITON_CACHE_DIR": "triton"}


def use_node_cache(cache: Path) -> None:
    """Point inductor's and Triton's caches into the node cache's `compile/` (a variable set by the user is kept)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    # Inductor writes its default directory into TORCHINDUCTOR_CACHE_DIR the first time anything asks for it (an
    # import may): that value is its own, not a choice to keep.
    own = {"TORCHINDUCTOR_CACHE_DIR": os.path.abspath(default_cache_dir())}
    for variable, name in CACHE_DIRS.items():
        if os.environ.get(variable) in (None, "", own.get(variable)):
            os.environ[variable] = str(cache / COMPILE / name)


def decoder_layers(model: Any) -> list[Any]:
    """The model's repeated blocks: the modules of the classes transformers keeps whole (`_no_split_modules`, its
    decoder layer), found through a PEFT or DeepSpeed wrapper."""
    inner = model
    while not hasattr(inner, "_no_split_modules") and hasattr(inner, "module"):
        inner = inner.module
    base = getattr(inner, "get_base_model", lambda: inner)()
    names = set(getattr(base, "_no_split_modules", None) or ())
    return [module for module in model.modules() if type(module).__name__ in names]


def compile_layers(model: Any, cache: Path) -> int:
    """Compile each decoder layer of `model` in place (state dict names unchanged); returns how many were."""
    use_node_cache(cache)
    layers = decoder_layers(model)
    if not layers:
        log.warning("train.compile: no decoder layer found in %s; the model stays eager", type(model).__name__)
        return 0
    for layer in layers:
        layer.compile()  # in place: the parameters keep their names, checkpoints and exports are unchanged
    log.info(
        "train.compile: %d decoder layers (%s) compiled at the first forward pass, caches in %s",
        len(layers),
        type(layers[0]).__name__,
        cache / COMPILE,
    )
    return len(layers)
