"""Write tests/fixtures/golden.json: reference cases computed by PyTorch (float64).

Run with torch installed (``.venv/bin/pip install torch==2.13.0``): ``make fixtures``.
The suite compares the service against this file, so it checks numbers where torch is absent.
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GOLDEN_SEED = 2026


def main() -> None:
    import torch

    from harness.torch_reference import build_cases

    cases = [
        {"name": name, "endpoint": endpoint, "request": request, "expected": expected}
        for name, endpoint, request, expected in build_cases(GOLDEN_SEED)
    ]
    out = {
        "generated_by": "scripts/make_golden.py",
        "torch_version": torch.__version__,
        "seed": GOLDEN_SEED,
        "cases": cases,
    }
    path = ROOT / "tests" / "fixtures" / "golden.json"
    path.write_text(json.dumps(out, indent=1, allow_nan=False) + "\n")
    print(f"wrote {len(cases)} cases to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
