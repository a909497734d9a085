"""Array and option types shared by the engine and the API that feeds it (one home for each)."""

from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
IntArray = NDArray[np.integer[Any]]  # positions

Alignment = Literal["upper_left", "lower_right"]  # causal masks
FullyMaskedPolicy = Literal["zero", "uniform", "error"]  # rows where every key is masked
Init = Literal["uniform", "normal"]  # generated arrays: rand or randn
NormOver = Literal["features", "all"]  # layer norm per token or over the whole matrix
WeightLayout = Literal["in_out", "out_in"]  # how a request's weights are laid out (API only)
QKNormType = Literal["rms", "layer"]  # RMSNorm (Zhang & Sennrich 2019) or LayerNorm
QKNormOver = Literal["head", "projection"]  # one head's d_k features, or all h·d_k of a token
# rotate_half (GPT-NeoX, HF LLaMA), pairs (RoFormer), or Gemma 4's halves over the whole head
RopeStyle = Literal["half", "interleaved", "proportional"]
