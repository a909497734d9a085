"""Write the golden fixtures: reference cases computed by PyTorch and transformers (float64).

- ``tests/fixtures/golden.json``: ``harness.torch_reference`` (PyTorch ops and modules);
- ``tests/fixtures/golden_layers.json``: ``harness.hf_reference`` (whole Hugging Face attention
  layers, nn.MultiheadAttention and scaled_dot_product_attention with their own inputs), then
  ``harness.hf_today`` (today's layers: gpt-oss with YaRN, Phi-3 with LongRoPE, Gemma 4,
  Qwen3-Next's output gate, Llama 4), which ``hf_reference.build_cases`` adds after its own.

Run with torch and transformers installed (``.venv/bin/pip install torch==2.13.0
transformers==5.23.0``): ``make fixtures``. The suite compares the service against these files,
so it checks numbers where torch is absent.
"""

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOLDEN_SEED = 2026
FIXTURES = ROOT / "tests" / "fixtures"


def _write(path: Path, out: dict[str, Any]) -> None:
    path.write_text(json.dumps(out, indent=1, allow_nan=False) + "\n")
    print(f"wrote {len(out['cases'])} cases to {path.relative_to(ROOT)}")


def _cases(build: Any) -> list[dict[str, Any]]:
    return [
        {"name": name, "endpoint": endpoint, "request": request, "expected": expected}
        for name, endpoint, request, expected in build(GOLDEN_SEED)
    ]


def main() -> None:
    import torch
    import transformers

    from harness import hf_reference, torch_reference

    _write(
        FIXTURES / "golden.json",
        {
            "generated_by": "scripts/make_golden.py",
            "torch_version": torch.__version__,
            "seed": GOLDEN_SEED,
            "cases": _cases(torch_reference.build_cases),
        },
    )
    _write(
        FIXTURES / "golden_layers.json",
        {
            "generated_by": "scripts/make_golden.py",
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
            "seed": GOLDEN_SEED,
            "cases": _cases(hf_reference.build_cases),
        },
    )


if __name__ == "__main__":
    main()
