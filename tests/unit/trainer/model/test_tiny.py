"""The built-in model is shaped like a real one: kernels (bitsandbytes' packed 4-bit CPU path on CPUs with
AVX512-BF16, among others) refuse linear layers whose sizes are not multiples of their block."""

from trainer.model.tiny import RECIPE


def test_every_linear_dimension_is_a_multiple_of_64() -> None:
    head_dim = RECIPE["hidden_size"] // RECIPE["num_attention_heads"]
    dims = {
        "hidden_size": RECIPE["hidden_size"],
        "intermediate_size": RECIPE["intermediate_size"],
        "vocab_size": RECIPE["vocab_size"],
        "head_dim": head_dim,
        "key/value projection": RECIPE["num_key_value_heads"] * head_dim,
    }
    assert RECIPE["hidden_size"] % RECIPE["num_attention_heads"] == 0
    assert {name: d for name, d in dims.items() if d % 64} == {}
