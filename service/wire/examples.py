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

# ---- today's layers (API.md, "Today's layers"); tests/api/test_examples_reference.py checks each
_X4 = [[1, 0, 0.5, 0], [0, 1, 0, 0.5], [0.5, 0.5, 1, 0], [0, 0, 0.5, 1]]
QWEN3_NEXT_GATED: dict[str, Any] = {
    "tokens": ["the", "cat", "sat", "down"],
    "x": _X4,
    "num_heads": 1,
    # head 0's 4 query rows, then its 4 gate rows (Qwen3-Next's q_proj: (…, h, 2·head_dim))
    "q_proj.weight": [
        [1, 0, 0.5, 0],
        [0, 1, 0, 0.5],
        [0.5, 0, 1, 0],
        [0, 0.5, 0, 1],
        [2, 0, 0, 0],
        [0, -2, 0, 0],
        [0, 0, 1, 1],
        [1, 1, -1, 0],
    ],
    "k_proj.weight": [[1, 0.5, 0, 0], [0, 0, 1, 0.5], [0.5, 0, 0, 1], [0, 1, 0.5, 0]],
    "v_proj.weight": [[1, 0, 0, 0.5], [0, 1, 0.5, 0], [0, 0, 1, 0], [0.5, 0, 0, 1]],
    "o_proj.weight": [[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0.5, 0.5, 0.5, 0.5]],
    "gate": True,
    "qk_norm": {"type": "rms", "eps": 1e-6, "zero_centered": True},
    "q_norm.weight": [0.1, -0.1, 0.2, 0.0],
    "k_norm.weight": [0.0, 0.1, 0.0, -0.2],
    "rope": {"base": 10000000, "rotary_dim": 2},
    "mask": {"type": "causal"},
    "include": ["concat", "gate", "gated", "output", "steps"],
    "decimals": 4,
}
LLAMA4_CHUNKED: dict[str, Any] = {
    "tokens": ["the", "cat", "sat", "down"],
    "x": _X4,
    "num_heads": 1,
    "q_proj.weight": [[1, 0, 0.5, 0], [0, 1, 0, 0.5], [0.5, 0, 1, 0], [0, 0.5, 0, 1]],
    "k_proj.weight": [[1, 0.5, 0, 0], [0, 0, 1, 0.5], [0.5, 0, 0, 1], [0, 1, 0.5, 0]],
    "v_proj.weight": [[1, 0, 0, 0.5], [0, 1, 0.5, 0], [0, 0, 1, 0], [0.5, 0, 0, 1]],
    "rope": {"base": 500000, "style": "interleaved"},
    "qk_norm": {"type": "rms", "eps": 1e-5, "after_rope": True},
    "mask": {"type": "chunked", "size": 2},
    "include": ["heads", "mask", "steps"],
    "decimals": 4,
}
GEMMA4_GLOBAL: dict[str, Any] = {
    "tokens": ["the", "cat", "sat", "down"],
    "x": _X4,
    "num_heads": 1,
    "q_proj.weight": [[1, 0, 0.5, 0], [0, 1, 0, 0.5], [0.5, 0, 1, 0], [0, 0.5, 0, 1]],
    "k_proj.weight": [[1, 0.5, 0, 0], [0, 0, 1, 0.5], [0.5, 0, 0, 1], [0, 1, 0.5, 0]],
    "q_norm.weight": [1, 1.5, 0.5, 1],
    "k_norm.weight": [1, 0.5, 1, 1.5],
    "qk_norm": {"type": "rms", "eps": 1e-6},
    "k_eq_v": True,
    "v_norm": {"eps": 1e-6},
    "scale": 1.0,
    "rope": {"base": 1000000, "style": "proportional", "rotary_dim": 2},
    "mask": {"type": "causal"},
    "include": ["heads", "steps"],
    "decimals": 4,
}
DEEPSEEK_MLA: dict[str, Any] = {
    "tokens": ["the", "cat", "sat", "down"],
    "x": _X4,
    "num_heads": 2,
    "q_a_proj.weight": [[1, 0, 0.5, 0], [0, 1, 0, 0.5], [0.5, 0, 1, 0]],
    "q_a_layernorm.weight": [1, 0.5, 1.5],
    "q_b_proj.weight": [
        [1, 0, 0],
        [0, 1, 0],
        [0, 0, 1],
        [1, 1, 0],
        [0, 1, 1],
        [1, 0, 1],
        [0.5, 0, 0],
        [0, 0.5, 0],
    ],
    "kv_a_proj_with_mqa.weight": [[1, 0.5, 0, 0], [0, 0, 1, 0.5], [0.5, 0, 0, 1], [0, 1, 0.5, 0]],
    "kv_a_layernorm.weight": [1, 2],
    "kv_b_proj.weight": [[1, 0], [0, 1], [1, 1], [0.5, -0.5], [1, -1], [0, 2]],
    "o_proj.weight": [[1, 0], [0, 1], [1, 1], [0.5, 0.5]],
    "mla": {
        "q_lora_rank": 3,
        "kv_lora_rank": 2,
        "qk_nope_head_dim": 2,
        "qk_rope_head_dim": 2,
        "v_head_dim": 1,
    },
    "rope": {"base": 10000, "style": "interleaved"},
    "mask": {"type": "causal"},
    "include": ["c_q", "c_kv", "k_rope", "heads", "output", "mla_cache_numbers", "steps"],
    "decimals": 4,
}
YARN_PAST_THE_CONTEXT: dict[str, Any] = {
    "tokens": ["far", "into", "the", "text"],
    "q": [[1, 0, 0.5, 0, 1, 0, 0.5, 0]] * 4,
    "k": [
        [0, 1, 0, 0.5, 0, 1, 0, 0.5],
        [1, 1, 0, 0, 1, 1, 0, 0],
        [0.5, 0, 1, 0, 0.5, 0, 1, 0],
        [0, 0, 1, 1, 0, 0, 1, 1],
    ],
    "v": [[1, 0], [0, 1], [0.5, 0.5], [2, -1]],
    "rope": {
        "base": 150000,
        "scaling": {
            "type": "yarn",
            "factor": 32,
            "original_max_position": 4096,
            "beta_fast": 32,
            "beta_slow": 1,
            "truncate": False,
        },
    },
    "positions": [9000, 9001, 9002, 9003],
    "context_positions": [9000, 9001, 9002, 9003],
    "mask": {"type": "causal"},
    "include": ["q_rotated", "weights", "steps"],
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
        "yarn",
        "YaRN as gpt-oss configures it, at positions 9000… past the original 4096",
        YARN_PAST_THE_CONTEXT,
    ),
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
    (
        "qwen3_next",
        "Qwen3-Next: the output gate inside q_proj.weight, (1 + w) norms",
        QWEN3_NEXT_GATED,
    ),
    ("llama4", "Llama 4: interleaved RoPE, then the L2 norm, chunked attention", LLAMA4_CHUNKED),
    ("gemma4", "Gemma 4's full layer: V = K, v_norm, proportional RoPE, scale 1", GEMMA4_GLOBAL),
    ("deepseek_mla", "DeepSeek's latent attention: latents, a shared RoPE key", DEEPSEEK_MLA),
)
