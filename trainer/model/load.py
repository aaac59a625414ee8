"""Load the base model through `from_pretrained` and make the trainable part (full, LoRA, Q-LoRA)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from config.footprint import read_model_json
from config.methods import Method
from config.vision import is_vision_language, unsupported
from core.errors import UserError
from trainer.model.vision import quantization_skips
from trainer.parallel.moe import expert_parameters, refuse_qlora

log = logging.getLogger(__name__)


def untrusted_code(model_path: str, exc: Exception) -> UserError | None:
    """The one line for transformers' refusal to run a directory's own code (its config.json's auto_map names classes
    of a model type transformers does not know) without trust_remote_code; None for another error."""
    if "trust_remote_code" not in str(exc):
        return None
    return UserError(
        f"model.name_or_path {model_path}: its config.json's auto_map names code the directory ships (a model type "
        "transformers does not know); read that code, then set model.trust_remote_code: true to run it"
    )


def model_config(model_path: str, *, trust_remote_code: bool = False) -> dict[str, Any]:
    """The model's config.json as a dict (read before loading: DeepSpeed's sizes and the partitioned load need it);
    `trust_remote_code` (model.trust_remote_code) lets a directory's own configuration class run."""
    from transformers import AutoConfig

    try:
        return dict(AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code).to_dict())
    except (OSError, ValueError) as exc:
        unreadable = UserError(f"model.name_or_path {model_path}: cannot read its config.json ({exc})")
        raise untrusted_code(model_path, exc) or unreadable from None


class PartitionedLoad:
    """While alive, Hugging Face's `from_pretrained` builds the model under DeepSpeed's `zero.Init` (through
    `HfDeepSpeedConfig`) and loads its checkpoint shard by shard into the partitions: under ZeRO-3 no rank ever holds
    the whole model, at load or after. It stays alive for the rank's life, as the Hugging Face Trainer keeps it:
    transformers asks it whether ZeRO-3 is on whenever it touches the parameters."""

    def __init__(self, ds_config: dict[str, Any]) -> None:
        from transformers.integrations import HfDeepSpeedConfig

        # DeepSpeed checks train_batch_size against micro-batch x accumulation x the whole world; with sequence
        # parallelism the batch counts data-parallel ranks only (the engine is given the groups), so that check would
        # refuse a right config here. zero.Init needs the ZeRO settings alone: DeepSpeed derives the batch.
        self.hf_config = HfDeepSpeedConfig({k: v for k, v in ds_config.items() if k != "train_batch_size"})


def partitioned_load(ds_config: dict[str, Any], method: Method, enabled: bool = True) -> PartitionedLoad | None:
    """The partitioned load for a ZeRO-3 config (full and LoRA) unless disabled (deepspeed.zero3_init); None
    otherwise. Q-LoRA's 4-bit base is loaded whole: bitsandbytes' quantized weights are not partitioned by
    zero.Init."""
    if not enabled or int(ds_config.get("zero_optimization", {}).get("stage", 0)) != 3 or not method.loads_partitioned:
        return None
    return PartitionedLoad(ds_config)


def parameter_count(model: Any, *, trainable: bool = False) -> int:
    """Parameters of a model, partitioned ones (ZeRO-3) counted whole."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad or not trainable)


def load_base(
    model_path: str,
    *,
    method: Method,
    bf16: bool,
    zero3: bool = False,
    trust_remote_code: bool = False,
    attention: str | None = None,
) -> Any:
    """The base causal LM (or vision-language model: trainer/model/vision.py) in bf16 (GPU) or fp32 (CPU); 4-bit nf4
    for Q-LoRA (a vision-language model's language model alone). Partitioned across the ranks while a PartitionedLoad
    is alive. With `trust_remote_code` (model.trust_remote_code) the classes of the directory's own
    code (config.json's auto_map) are used. `attention`: transformers' attn_implementation (trainer/model/attention.py),
    None for its default.

    Under ZeRO-3 (`zero3`), Q-LoRA's packed 4-bit weights are stored in the compute dtype instead of uint8: ZeRO-3
    partitions only floating-point parameters, and one dtype for every parameter lets it flatten them together."""
    from transformers import BitsAndBytesConfig

    kwargs: dict[str, Any] = {"dtype": torch.bfloat16 if bf16 else torch.float32}
    kwargs["trust_remote_code"] = trust_remote_code
    if attention is not None:
        kwargs["attn_implementation"] = attention
    own_code = False
    published = read_model_json(model_path) or {}  # a vision-language model's config.json: its class, its skips
    if (why := unsupported(published)) is not None:
        raise UserError(f"model.name_or_path {model_path}: {why}")
    if method.quantizes_base:
        config = model_config(model_path, trust_remote_code=trust_remote_code)
        # A model's own code decides how it holds its experts (one Linear each quantizes): checked once it is built.
        own_code = trust_remote_code and "auto_map" in config
        if not own_code:
            refuse_qlora(model_path, config)
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=kwargs["dtype"],
            llm_int8_skip_modules=quantization_skips(published),
            **({"bnb_4bit_quant_storage": kwargs["dtype"]} if zero3 else {}),
        )
    model = _from_pretrained(model_path, kwargs, published)
    if own_code and expert_parameters(model):
        refuse_qlora(model_path, config)
    return model


def auto_class(config: dict[str, Any]) -> Any:
    """The transformers auto class that loads a model of this config: AutoModelForCausalLM, or for a vision-language
    model AutoModelForImageTextToText."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM


def _from_pretrained(model_path: str, kwargs: dict[str, Any], config: dict[str, Any]) -> Any:
    """from_pretrained of the model's auto class (`auto_class`), its refusals of the directory as one line."""
    auto = auto_class(config)
    try:
        return auto.from_pretrained(model_path, **kwargs)
    except (OSError, ValueError) as exc:
        if (refused := untrusted_code(model_path, exc)) is not None:
            raise refused from None
        if isinstance(exc, ValueError):
            raise
        raise UserError(f"model.name_or_path {model_path}: cannot load ({exc})") from None


def ensure_pad_token_id(model: Any, model_path: str, *, trust_remote_code: bool = False) -> int:
    """The id that pads a micro-batch's rows: the model config's `pad_token_id`, else the tokenizer's pad token, else
    its EOS token; written into the model's config when it had none, so that generation and the export read the same.

    Qwen2.5 and Qwen3 publish a config.json without `pad_token_id` (their tokenizer config names the pad token). Any
    id the model knows is safe as padding: a padded position's label is -100 (never a target), its attention-mask
    entry is 0 (no token attends to it), and packed rows restart positions instead of padding within a row."""
    configured = getattr(model.config, "pad_token_id", None)
    if configured is not None:
        return int(configured)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    for role in ("pad", "eos"):
        token_id = getattr(tokenizer, f"{role}_token_id", None)
        if token_id is not None:
            token = getattr(tokenizer, f"{role}_token")
            log.info(
                "%s/config.json has no pad_token_id: padding with the tokenizer's %s token %s (id %d)",
                model_path,
                role,
                token,
                token_id,
            )
            model.config.pad_token_id = int(token_id)
            return int(token_id)
    raise UserError(
        f"model.name_or_path {model_path}: neither config.json's pad_token_id nor the tokenizer's pad or eos token is "
        'set; add "pad_token_id" to config.json (any id of the vocabulary: padding is never a target)'
    )
