"""The parallel layout: process groups, sequence parallelism, a mixture of experts' routing and leaves."""
