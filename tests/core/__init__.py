"""The engine (service/core) against values derived by hand, Hypothesis properties, and PyTorch, transformers and flex_attention in float64."""
