"""Worked examples, selectable in Swagger UI's "Try it out" and used by the tests and README."""

from typing import Any

from fastapi.openapi.models import Example

I_AM_BATMAN: dict[str, Any] = {
    "tokens": ["I", "am", "Batman"],
    "x": [[1, 0], [0, 0], [0, 1]],
    "w_q": [[1, 2], [3, 4]],
    "w_k": [[0.5, 1], [1.5, 1]],
    "w_v": [[1, 0.5], [0.5, 1]],
    "weight_layout": "out_in",
}
THE_CAT_SAT: dict[str, Any] = {
    "tokens": ["The", "cat", "sat"],
    "x": [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]],
    "seed": 0,
    "d_k": 4,
}
GENERATED_SENTENCE: dict[str, Any] = {
    "sentence": "attention is all you need",
    "seed": 42,
    "d_model": 4,
    "d_k": 3,
    "decimals": 4,
}
CAUSAL_FOUR_TOKENS: dict[str, Any] = {
    "tokens": ["my", "dog", "likes", "walks"],
    "q": [[1, 0], [0, 1], [1, 1], [0.5, -1]],
    "k": [[1, 0], [0, 1], [1, 1], [-1, 0.5]],
    "v": [[1, 0], [0, 1], [0.5, 0.5], [2, -1]],
    "mask": {"type": "causal"},
}
PADDED_BATCH: dict[str, Any] = {
    "q": [[[1, 0], [0, 1], [1, 1]], [[0, 1], [1, 0], [1, -1]]],
    "k": [[[1, 0], [0, 1], [1, 1]], [[0, 1], [1, 0], [1, -1]]],
    "v": [[[1, 2], [3, 4], [5, 6]], [[6, 5], [4, 3], [2, 1]]],
    "mask": [{"type": "padding", "key_lengths": [3, 2]}, {"type": "causal"}],
}
ALIBI_WINDOW: dict[str, Any] = {
    "sentence": "a b c d",
    "seed": 1,
    "d_model": 2,
    "d_k": 2,
    "mask": [
        {"type": "window", "left": 1, "right": 0},
        {
            "type": "additive",
            "matrix": [[0, -1, -2, -3], [-1, 0, -1, -2], [-2, -1, 0, -1], [-3, -2, -1, 0]],
        },
    ],
    "decimals": 4,
}
TWO_HEADS_FULL_BLOCK: dict[str, Any] = {
    "tokens": ["I", "am", "Batman"],
    "x": [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 0, 0]],
    "num_heads": 2,
    "w_q": [[1, 0, 0, 1], [0, 1, 1, 0], [1, 1, 0, 0], [0, 0, 1, 1]],
    "w_k": [[0, 1, 1, 0], [1, 0, 0, 1], [0, 0, 1, 1], [1, 1, 0, 0]],
    "w_v": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]],
    "positional_encoding": [[0, 0.1, 0, 0.1], [0.1, 0, 0.1, 0], [0.2, 0.2, 0.2, 0.2]],
    "w_o": [[0.5, 0, 0, 0], [0, 0.5, 0, 0], [0, 0, 0.5, 0], [0, 0, 0, 0.5]],
    "residual": True,
    "layer_norm": True,
    "decimals": 4,
}
GENERATED_MULTIHEAD: dict[str, Any] = {
    "sentence": "the cat sat on the mat",
    "seed": 0,
    "d_model": 8,
    "num_heads": 2,
    "positional_encoding": "sinusoidal",
    "mask": {"type": "causal"},
    "include": ["average_weights", "output", "summary", "steps", "tokens"],
    "decimals": 4,
}


# ---- the variants (API.md, "Position and score variants" and "PyTorch and Hugging Face as they
# are"); tests/api/test_examples_reference.py checks each against an independent reference
LLAMA_LAYER: dict[str, Any] = {
    "tokens": ["the", "cat", "sat", "down"],
    "x": [[1, 0, 0.5, 0], [0, 1, 0, 0.5], [0.5, 0.5, 1, 0], [0, 0, 0.5, 1]],
    "num_heads": 2,
    "q_proj.weight": [[1, 0, 0.5, 0], [0, 1, 0, 0.5], [0.5, 0, 1, 0], [0, 0.5, 0, 1]],
    "k_proj.weight": [[1, 0.5, 0, 0], [0, 0, 1, 0.5]],
    "v_proj.weight": [[1, 0, 0, 0.5], [0, 1, 0.5, 0]],
    "o_proj.weight": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0.5, 0.5, 0.5, 0.5]],
    "rope": {"base": 10000},
    "mask": {"type": "causal"},
    "include": ["heads", "output", "steps"],
    "decimals": 4,
}
ALIBI_SIX_HEADS: dict[str, Any] = {
    "sentence": "the cat sat on",
    "seed": 0,
    "d_model": 6,
    "num_heads": 6,
    "alibi": True,
    "mask": {"type": "causal"},
    "include": ["average_weights", "steps"],
    "decimals": 4,
}
SOFTCAP_LARGE_SCORES: dict[str, Any] = {
    "tokens": ["a", "b", "c"],
    "q": [[2], [4], [8]],
    "k": [[5], [2.5], [0]],
    "v": [[1, 0], [0, 1], [0.5, 0.5]],
    "softcap": 10,
    "include": ["scaled_scores", "capped_scores", "weights"],
    "decimals": 4,
}
SINK_CAUSAL: dict[str, Any] = {
    "tokens": ["I", "am", "here"],
    "q": [[1, 0, 1, 0], [0, 1, 0, 1], [1, 1, 1, 1]],
    "k": [[0, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 1]],
    "v": [[1, 0], [0, 1], [0.5, 0.5]],
    "sinks": 1.0,
    "mask": {"type": "causal"},
    "include": ["scaled_scores", "weights", "sink_weights"],
    "decimals": 4,
}

# ---- compare with your numbers (API.md, "Compare with your numbers")
# A course notebook's weights as it printed them (np.set_printoptions(precision=4)), from
#     weights = np.exp(scores) / np.exp(scores).sum(axis=0) / np.sqrt(d_k)
# with scores = (x @ w_q) @ (x @ w_k).T: the softmax down the columns and the scale after it,
# in one line. tests/api/test_examples_reference.py recomputes these numbers with torch.
COURSE_NOTEBOOK: dict[str, Any] = {
    "tokens": ["The", "cat", "sat"],
    "x": [[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]],
    "w_q": [[1, 0], [0, 1], [1, 0], [0, 1]],
    "w_k": [[0, 1], [1, 0], [0, 1], [1, 1]],
    "w_v": [[1, 0], [0, 1], [0.5, 0], [0, 0.5]],
    "expected": {
        "weights": [[0.0002, 0.0125, 0.0002], [0.6942, 0.0125, 0.6226], [0.0127, 0.6821, 0.0843]]
    },
    "tolerance": {"atol": 5e-5, "rtol": 0},  # half a unit of the 4th printed decimal
    "include": ["weights"],
    "decimals": 4,
}


def _examples(*items: tuple[str, str, dict[str, Any]]) -> dict[str, Example]:
    return {key: Example(summary=summary, value=value) for key, summary, value in items}


ATTENTION_EXAMPLES = _examples(
    ("batman", "I am Batman: 3 tokens, PyTorch-layout weights (out_in)", I_AM_BATMAN),
    ("the_cat_sat", "The cat sat: given x, weights from seed 0 (d_k 4)", THE_CAT_SAT),
    ("generated_sentence", "A sentence with generated embeddings and weights", GENERATED_SENTENCE),
    ("causal", "Direct q, k, v with a causal mask", CAUSAL_FOUR_TOKENS),
    ("softcap", "What soft-capping does to large scores (softcap 10)", SOFTCAP_LARGE_SCORES),
    ("sink", "Where the sink takes the weight (sinks 1.0, causal mask)", SINK_CAUSAL),
    (
        "compare",
        "Compare with your numbers: a notebook's weights, two mistakes named",
        COURSE_NOTEBOOK,
    ),
)
MASK_EXAMPLES = _examples(
    ("causal", "Causal mask over 4 tokens", CAUSAL_FOUR_TOKENS),
    ("padded_batch", "A batch of 2 with key padding and a causal mask", PADDED_BATCH),
    ("alibi_window", "A local window and ALiBi-style additive biases", ALIBI_WINDOW),
)
MULTIHEAD_EXAMPLES = _examples(
    (
        "two_heads",
        "Two heads, explicit positional encoding, W_o, residual, layer norm",
        TWO_HEADS_FULL_BLOCK,
    ),
    ("generated", "A generated sentence, sinusoidal encoding, causal mask", GENERATED_MULTIHEAD),
    (
        "llama",
        "A LLaMA attention layer step by step: Hugging Face weights, GQA, RoPE, causal",
        LLAMA_LAYER,
    ),
    ("alibi", "ALiBi on 6 heads: the paper's slopes when h is not a power of two", ALIBI_SIX_HEADS),
)
