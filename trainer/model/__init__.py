"""The model's construction: load, kernels, attention, compile, tiled MLP, adapters, the built-in models."""
