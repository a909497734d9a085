"""Print the worked examples of docs/examples.md: each curl command and the service's real answer.

Run against the ASGI app (no server needed): ``.venv/bin/python scripts/readme_examples.py``.
tests/docs/test_readme.py replays every curl block of README.md and docs/ and checks the JSON shown.
"""

import json
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.wire import examples as ex

EXAMPLES: list[tuple[str, str, dict[str, Any] | None]] = [
    (
        "Scaled dot-product attention, “I am Batman” with PyTorch-layout weights:",
        "/attention",
        {**ex.I_AM_BATMAN, "decimals": 4, "include": ["scores", "weights", "output", "summary"]},
    ),
    (
        "A causal mask over four tokens (masked scores are `null`):",
        "/mask",
        {
            **ex.CAUSAL_FOUR_TOKENS,
            "decimals": 3,
            "include": ["masked_scores", "weights", "fully_masked_rows"],
        },
    ),
    (
        "Two heads with weights from a seed, a sinusoidal encoding and a residual:",
        "/multihead",
        {
            "sentence": "the cat sat",
            "seed": 0,
            "d_model": 4,
            "num_heads": 2,
            "positional_encoding": "sinusoidal",
            "residual": True,
            "decimals": 3,
            "include": ["average_weights", "output"],
        },
    ),
    (
        "A LLaMA attention layer step by step: Hugging Face's `q_proj.weight` … `o_proj.weight` "
        "as they are, 2 query heads sharing 1 key/value head (GQA), RoPE and a causal mask "
        "(`output` is `LlamaAttention`'s, checked by tests/api/test_examples_reference.py):",
        "/multihead",
        ex.LLAMA_LAYER,
    ),
    (
        "ALiBi on 6 heads: 6 is not a power of two, so the slopes follow the paper's rule "
        "(those for 4 heads, then every other one for 8); the `position_bias` step lists them:",
        "/multihead",
        ex.ALIBI_SIX_HEADS,
    ),
    (
        "What soft-capping does to large scores: `softcap` 10 squeezes 20 and 40 to 9.64 and "
        "9.99, so a score twice as large no longer takes almost all the weight:",
        "/attention",
        ex.SOFTCAP_LARGE_SCORES,
    ),
    (
        "Where the sink takes the weight: the sink logit 1.0 joins each row's softmax, so a row "
        "sums to 1 − its `sink_weights`; the first query, with one key, gives the sink the most:",
        "/attention",
        ex.SINK_CAUSAL,
    ),
    (
        "Compare with your numbers: a course notebook computed `weights = np.exp(scores) / "
        "np.exp(scores).sum(axis=0) / np.sqrt(d_k)` and printed it to 4 decimals. Sent as "
        "`expected` (with a tolerance of half the last printed digit), the answer names the first "
        "step that differs and the two mistakes in that line, found by recomputing the step "
        "with them:",
        "/attention",
        ex.COURSE_NOTEBOOK,
    ),
    ("Liveness:", "/healthz", None),
]


def flat(value: Any) -> bool:
    """A number, string, flag or null, or a list of them (a step's shape)."""
    if isinstance(value, list):
        return not any(isinstance(v, dict | list) for v in value)
    return not isinstance(value, dict)


def compact(value: Any, indent: int = 0) -> str:
    """JSON with objects one key a line and lists of numbers (or rows of them) on one line; a
    nested object of numbers, strings and flat lists (a step) on one line too."""
    pad = " " * indent
    if isinstance(value, dict) and indent and all(map(flat, value.values())):
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    if isinstance(value, dict):
        inner = ",\n".join(f'{pad}  "{k}": {compact(v, indent + 2)}' for k, v in value.items())
        return "{\n" + inner + "\n" + pad + "}"
    if isinstance(value, list) and value and isinstance(value[0], dict):
        inner = ",\n".join(pad + "  " + compact(v, indent + 2) for v in value)
        return "[\n" + inner + "\n" + pad + "]"
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def main() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from fastapi.testclient import TestClient

    from service.main import app

    client = TestClient(app)
    for text, path, body in EXAMPLES:
        print(text + "\n\n```bash")
        if body is None:
            print(f"curl -s localhost:8000{path}")
            answer = client.get(path).json()
        else:
            print(f"curl -s localhost:8000{path} -H 'Content-Type: application/json' \\")
            print(f"  -d '{json.dumps(body, ensure_ascii=False)}'")
            answer = client.post(path, json=body).json()
        print("```\n\n```json\n" + compact(answer) + "\n```\n")


if __name__ == "__main__":
    main()
