"""Row M1 of `make bench` (benchmarks/run.py): POST /model with all-MiniLM-L6-v2 on 128 tokens,
every output (every layer's and head's weights, head roles, rollout, layer 0's whole trace),
answered as safetensors (as the Python client asks), end to end with curl (the answer received
whole and discarded: a client's disk is not the service's time; written to a file, it is in the
detail) ÷ the same forward in transformers' BertModel, float64, eager, with
``output_attentions=True``, in process (the sides alternating, medians; the best pair and the
pairs' median in the detail). The same request answered as JSON is timed too, for the detail. The
service's answer is checked against transformers' weights (1e-10) before anything is timed."""

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TOKENS = 128
TEXT = " ".join(["word"] * (TOKENS - 2))  # [CLS] + 126 + [SEP]
WHAT = "POST /model minilm, 128 tokens, every output, end to end"


def m1(
    base: str, tmp: Path, runs: int, row: Callable[..., Any], skipped: Callable[..., Any]
) -> Any:
    try:
        import torch
        import transformers
        from safetensors.torch import load_file
    except ImportError:
        return skipped("M1", WHAT, "needs torch and transformers", "≤ 1.5")
    from service.config import Settings

    directory = Settings().models_dir / "minilm"
    if not (directory / "model.safetensors").is_file():
        return skipped("M1", WHAT, "minilm is not installed (make models)", "≤ 1.5")
    config = transformers.BertConfig.from_pretrained(str(directory))
    config._attn_implementation = "eager"
    model: Any = transformers.BertModel(config, add_pooling_layer=False)
    model = model.to(torch.float64).eval()
    state = load_file(str(directory / "model.safetensors"))
    model.load_state_dict({k: v.to(torch.float64) for k, v in state.items()}, strict=False)
    fast: Any = transformers.PreTrainedTokenizerFast
    tokenizer = fast(tokenizer_file=str(directory / "tokenizer.json"))
    ids = torch.tensor([tokenizer(TEXT)["input_ids"]])
    assert ids.shape[1] == TOKENS

    body = tmp / "M1.json"
    body.write_text(json.dumps({"model": "minilm", "text": TEXT, "layer": 0}))
    answer = tmp / "M1.out.json"

    def service(accept: str = "application/x-safetensors", keep: bool = False) -> float:
        """curl's time for the answer, received whole and discarded (``keep``: written to
        the answer's file, as the check before the timing reads it)."""
        start = time.perf_counter()
        out = subprocess.run(
            ["curl", "-s", "-o", str(answer) if keep else os.devnull, "-w", "%{http_code}", "-H",
             "Content-Type: application/json", "-H", f"Accept: {accept}",
             "--data-binary", f"@{body}", base + "/model"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
        assert out == "200", out
        return time.perf_counter() - start

    def reference() -> float:
        start = time.perf_counter()
        with torch.no_grad():
            model(ids, output_attentions=True)
        return time.perf_counter() - start

    from safetensors.numpy import load

    service(keep=True)
    with torch.no_grad():
        want = np.stack([a[0].numpy() for a in model(ids, output_attentions=True).attentions])
    got = load(answer.read_bytes())["attention"]
    assert np.abs(got - want).max() <= 1e-10, "the service's weights are not transformers'"
    size = answer.stat().st_size / 1e6
    ours, theirs, as_json, kept = [], [], [], []
    for _ in range(runs):
        ours.append(service())
        theirs.append(reference())
        kept.append(service(keep=True))
        as_json.append(service("application/json", keep=True))  # last: its file is measured
    json_size = answer.stat().st_size / 1e6
    s, t, j, f = (float(np.median(v)) for v in (ours, theirs, as_json, kept))
    pairs = [a / b for a, b in zip(ours, theirs, strict=True)]  # each run beside its reference
    return row("M1", WHAT, s / t, "≤", 1.5,
               f"service {s * 1e3:.0f} ms (a {size:.1f} MB safetensors answer, received by curl "
               f"and discarded; {f * 1e3:.0f} ms written to a file; as JSON {j * 1e3:.0f} ms, "
               f"{json_size:.1f} MB), transformers {t * 1e3:.0f} ms in process (medians of "
               f"{runs}, alternating); the best pair {min(pairs):.2f}, the pairs' median "
               f"{float(np.median(pairs)):.2f}")  # fmt: skip
