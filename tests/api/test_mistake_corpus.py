"""The corpus of real mistakes (issue 42): one row per mistake people really make — a course
notebook's slip, a tutorial's line, a porting bug from a public issue or pull request — and
per correct computation that must match (float64, its prints, low-precision kernels), each
sent to the service the way its author computed it, with the verdict the diagnosis must give.

The measure (issue 42's goal): over every row, **no false match** (the service says "match"
where the row is a mistake), **no wrong name** (a diagnosis naming other codes than the row's),
and at least 90 % **right**; "not named" (no diagnosis where a code was due) and "false alarm"
(correct numbers called wrong) are counted too. ``test_the_corpus_measure`` asserts the goal
and prints the table; ``python -m tests.api.test_mistake_corpus`` prints it alone.

Where the numbers come from (never from the service's functions: ``service`` is imported only
for the app the script runs): the builders of the compare tests, imported from them —
``tests/api/test_compare_mistakes.py`` (float64 NumPy notebooks, torch forwards, transformers'
``LlamaAttention``), ``test_compare_third_edition.py`` (ports calling
``scaled_dot_product_attention``, the lecture's layer, NumPy written there),
``test_decode.py`` (transformers' ``LlamaAttention`` with its ``DynamicCache``),
``test_compare_olmo_granite.py`` (stock OLMo and Granite layers), ``test_compare_precision.py``
(torch's SDPA in bfloat16 and float16), ``test_printed.py`` (torch's and NumPy's prints) — and
the few bugs written here in torch or NumPy (the ViT tutorial's scale, a mask multiplied in,
SDPA handed an upper-triangular mask, ``triu(…, 0)``, YaRN's factor twice, DeepSeek V3's
``DeepseekV3Attention`` with its mscale² left out, run through ``harness``'s float64 patches).
Each imported builder is checked against the right computation in its own file; the bugs
written here, removed, give the right numbers (``test_builder_*``).

A source is a public issue or pull request (``owner/repo#number``) where one reports the
mistake, else the tutorial or library behaviour it comes from, described in words.
"""

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
    import torch
torch = pytest.importorskip("torch", reason="PyTorch is not installed (torch==2.13.0)")
pytest.importorskip("transformers", reason="transformers is not installed")
pytest.importorskip("ml_dtypes")

from transformers import GraniteConfig, OlmoConfig  # noqa: E402
from transformers.models.granite import modeling_granite  # noqa: E402
from transformers.models.llama import modeling_llama  # noqa: E402
from transformers.models.olmo import modeling_olmo  # noqa: E402

from tests.api import test_compare_mistakes as second  # noqa: E402
from tests.api import test_compare_third_edition as third  # noqa: E402
from tests.api.test_api_olmo_granite import (  # noqa: E402
    CLIP,
    MULTIPLIER,
    _config,
    _request,
    _run,
)
from tests.api.test_compare_olmo_granite import HEAD_DIM  # noqa: E402
from tests.api.test_compare_precision import body as kernel_body  # noqa: E402
from tests.api.test_compare_precision import kernel, plain  # noqa: E402
from tests.api.test_decode import body_of, decode, llama  # noqa: E402
from tests.api.test_printed import BODY as PRINTED_BODY  # noqa: E402
from tests.api.test_printed import batman, numbers_of, torch_print, weights  # noqa: E402

pytestmark = pytest.mark.torch

Json = dict[str, Any]
Tensor = Any  # torch.Tensor (torch comes through importorskip)
F = torch.nn.functional
F64 = torch.float64
js = second.js
TIGHT: Json = {"atol": 1e-10, "rtol": 0}  # the third edition's float64 agreement
MATCH, DIFFERS = "match", "differs"  # the verdicts that are no code
Expect = tuple[str, ...]  # the codes, in the table's order; or (MATCH,) or (DIFFERS,)


@dataclass(frozen=True)
class Row:
    """One real mistake (or one correct computation): where it comes from, the request with
    the caller's numbers in ``expected``, and the verdict the service must give."""

    id: str
    source: str
    endpoint: str
    body: Json
    expect: Expect

    @property
    def expected_text(self) -> str:
        return "+".join(self.expect)


# ---- the rows' builders: each returns the request with the caller's numbers -----------------


def second_case(case_id: str) -> tuple[str, Json]:
    """A case of test_compare_mistakes (its singles and pairs), by id: endpoint and request."""
    [case] = [c for c in (*second.SINGLES, *second.PAIRS) if c.id == case_id]
    return case.endpoint, {**case.body, "expected": case.expected}


def tight(body: Json) -> Json:
    """The third edition's requests carry float64's tolerance (its ``diagnosed`` adds it)."""
    return {"tolerance": TIGHT, **body}


BATMAN: Json = {  # the README's "I am Batman" request (its numbers, written out here)
    "tokens": ["I", "am", "Batman"],
    "x": [[1, 0], [0, 0], [0, 1]],
    "w_q": [[1, 2], [3, 4]],
    "w_k": [[0.5, 1], [1.5, 1]],
    "w_v": [[1, 0.5], [0.5, 1]],
    "weight_layout": "out_in",
}


def batman_slip(name: str, at: tuple[int, int]) -> Json:
    """A hand computation of Batman's Q or K with one entry 0.1 off (1.4 typed for 1.5)."""
    q, k = batman()
    theirs = (k if name == "k" else q).copy()
    theirs[at] -= 0.1
    return {**BATMAN, "expected": {name: theirs.tolist()}}


def printed_weights(precision: int) -> Json:
    """NumPy's print of the right weights at ``precision`` decimals, copied as a student does."""
    text = np.array2string(weights(), precision=precision, separator=", ", floatmode="fixed")
    return {**PRINTED_BODY, "expected": {"weights": numbers_of(text)}}


def course_notebook() -> Json:
    """docs/api.md 2.7's course notebook: ``np.exp(scores) / np.exp(scores).sum(axis=0) /
    np.sqrt(d_k)``, printed at 4 decimals (the request's own tolerance, atol 5e-5)."""
    x = np.array([[1, 0, 1, 0], [0, 2, 0, 2], [1, 1, 1, 1]], dtype=float)
    w_q = np.array([[1, 0], [0, 1], [1, 0], [0, 1]], dtype=float)
    w_k = np.array([[0, 1], [1, 0], [0, 1], [1, 1]], dtype=float)
    w_v = np.array([[1, 0], [0, 1], [0.5, 0], [0, 0.5]], dtype=float)
    scores = (x @ w_q) @ (x @ w_k).T
    theirs = np.exp(scores) / np.exp(scores).sum(axis=0) / np.sqrt(2)
    return {
        "tokens": ["The", "cat", "sat"],
        **{n: a.tolist() for n, a in (("x", x), ("w_q", w_q), ("w_k", w_k), ("w_v", w_v))},
        "expected": {"weights": np.round(theirs, 4).tolist()},
        "tolerance": {"atol": 5e-05, "rtol": 0},
    }


def llama_step(
    at: list[int] | None, *, tokens: int = 7, seed: int = 21, scaling: float | None = None
) -> Json:
    """transformers' LlamaAttention (4 heads, 2 KV heads, float64) decoding the tokens after a
    prefill of 5 with its DynamicCache, the new tokens rotated at ``at`` (None: right), and
    ``scaling`` set on the layer (a port that forgot 1/√d_k): the step as a request."""
    layer, rotary, config = llama()
    if scaling is not None:
        layer.scaling = scaling
    x = torch.randn(1, tokens, 8, dtype=F64, generator=torch.Generator().manual_seed(seed))
    past_k, past_v, out, _ = decode(layer, rotary, config, modeling_llama, x, 5, positions=at)
    mask = {"mask": {"type": "causal"}} if tokens > 6 else {}
    return body_of(layer, x[:, 5:], past_k, past_v, rope={"base": 10000.0}, include=["output"],
                   expected={"output": out[0].tolist()}, **mask)  # fmt: skip


def kv_tiled() -> Json:
    theirs = third.port(third.X16, third.W_GQA, third.H8, third.sdpa(is_causal=True),
                        h_kv=third.H_KV, tile=True)["output"]  # fmt: skip
    return tight(third.gqa_request(mask={"type": "causal"}, expected={"output": js(theirs[0])}))


def kv_tiled_numpy() -> Json:
    """Heads given per head, the grouped K and V spread with ``np.tile`` (ONNX's reference)."""
    rng = np.random.default_rng(69)
    q, k, v = rng.normal(size=(4, 3, 2)), rng.normal(size=(2, 3, 2)), rng.normal(size=(2, 3, 2))
    kt, vt = np.tile(k, (2, 1, 1)), np.tile(v, (2, 1, 1))  # heads 0, 1, 0, 1
    s = q @ kt.transpose(0, 2, 1) / np.sqrt(2)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    concat = (w @ vt).transpose(1, 0, 2).reshape(3, -1)
    body = {"q": q.tolist(), "k": k.tolist(), "v": v.tolist(), "num_heads": 4}
    return tight({**body, "expected": {"output": concat.tolist()}})


def cache_step(**mistakes: bool) -> Json:
    """third.port_cache's GQA decode step (2 new tokens after 3) with the port's mistakes."""
    theirs = third.port_cache(third.X16, **mistakes)
    body = third.gqa_request(third.X16[:, 3:], past=theirs["past"])
    return tight({**body, "expected": {"output": js(theirs["output"][0])}})


def meta_rope_tiled() -> Json:
    causal = third.sdpa(is_causal=True)
    theirs = third.port(third.X16, third.W_GQA, third.H8, causal, h_kv=third.H_KV, tile=True,
                        rotate=third.rope_meta)["output"]  # fmt: skip
    return tight(third.gqa_request(mask={"type": "causal"}, expected={"output": js(theirs[0])}))


def gqa_right() -> Json:
    right = third.port(third.X16, third.W_GQA, third.H8,
                       third.sdpa(is_causal=True, enable_gqa=True), h_kv=third.H_KV)  # fmt: skip
    body = {"mask": {"type": "causal"}, "expected": {"output": js(right["output"][0])}}
    return tight(third.gqa_request(**body))


def sliding(attend: Any) -> Json:
    theirs = third.port(third.X, third.W, 2, attend)["output"]
    return tight(third.layer_request(third.W, **third.SLIDING, expected={"output": js(theirs[0])}))


def chunked_as_causal() -> Json:
    q, k, v = (third.randn(1, third.L6, 4, seed=s) for s in (1, 2, 3))
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    body = {**third.direct(q, k, v), "mask": [{"type": "chunked", "size": 3}]}
    return tight({**body, "expected": {"output": js(theirs[0])}})


def gemma2_27b_port() -> Json:
    x = third.randn(1, third.L6, 12, seed=33)
    w = {p: third.weights_of(8, 12, 50 + i) for i, p in enumerate("qkv")}
    w["o"] = third.weights_of(12, 8, 53)
    theirs = third.port(x, w, 2, third.sdpa(is_causal=True))["output"]
    body = third.layer_request(w, x, **third.SLIDING, scale=6**-0.5)
    return tight({**body, "expected": {"output": js(theirs[0])}})


def port8(base: float = 10000.0, **rest: Any) -> Json:
    """A Llama port (d_model 16, 2 heads of 8, 8 tokens, causal) rotating with ``base``."""
    theirs = third.port(third.X8, third.W16, 2, third.sdpa(is_causal=True), base=base)
    body = third.layer_request(third.W16, third.X8, mask={"type": "causal"},
                               expected={"output": js(theirs["output"][0])})  # fmt: skip
    return tight({**body, **rest})


def lecture(scale_by: int, project: bool) -> Json:
    request, out = third.lecture(scale_by, project)
    return tight({**request, "expected": {"output": js(out[0])}})


def over_batch(scale: float) -> Json:
    qb, kb, vb = third.QB, third.KB, third.VB
    out = third.implicit_softmax(qb @ kb.transpose(1, 2) * scale) @ vb
    return tight({**third.batched(qb, kb, vb), "expected": {"output": js(out)}})


def one_item() -> tuple[Tensor, Tensor, Tensor]:
    q, k, v = (t[:1] for t in third.QKV)
    return q, k, v


def fill_causal(fill: float) -> Json:
    """``scores.masked_fill(~tril, fill)`` then the softmax, one sequence of 6."""
    q, k, v = one_item()
    theirs = third.filled(q, k, third.causal_mask(third.L6), fill)
    body = {**third.batched(q[0], k[0], v[0]), "mask": {"type": "causal"}}
    return tight({**body, "expected": {"weights": js(theirs[0])}})


def fill_left_padded(fill: float) -> Json:
    """The same fill on a left-padded batch of two under the causal mask."""
    q, k, v = third.QKV
    allowed = third.causal_mask(third.L6) & ~third.LEFT_PADDED[:, None, :]
    theirs = third.filled(q, k, allowed, fill)
    body = {**third.batched(q, k, v), "mask": {"type": "causal"},
            "key_padding_mask": js(third.LEFT_PADDED)}  # fmt: skip
    return tight({**body, "expected": {"weights": js(theirs)}})


def mask_multiplied() -> Json:
    """A notebook masking by multiplying the scores with the 0/1 ``tril`` matrix: the masked
    scores become 0, not −∞ (the scale 1/√d_k = 0.5 applied as it should)."""
    q, k, v = one_item()
    scores = q @ k.transpose(-2, -1) * 0.5 * torch.tril(torch.ones(third.L6, third.L6))
    out = F.softmax(scores, dim=-1) @ v
    body = {**third.batched(q[0], k[0], v[0]), "mask": {"type": "causal"}}
    return tight({**body, "expected": {"output": js(out[0])}})


def tril_unscaled() -> Json:
    q, k, v = one_item()
    theirs = F.softmax(torch.tril(q @ k.transpose(-2, -1)), dim=-1) @ v
    body = {**third.batched(q[0], k[0], v[0]), "mask": {"type": "causal"}}
    return tight({**body, "expected": {"output": js(theirs[0])}})


def annotated_transformer() -> Json:
    """The Annotated Transformer's ``masked_fill(mask == 0, -1e9)``: masked scores, weights and
    output."""
    q, k, v = one_item()
    scores = (q @ k.transpose(-2, -1) * 0.5).masked_fill(~third.causal_mask(third.L6), -1e9)
    w = F.softmax(scores, dim=-1)
    expected = {"masked_scores": js(scores[0]), "weights": js(w[0]), "output": js((w @ v)[0])}
    return tight({**third.batched(q[0], k[0], v[0]), "mask": {"type": "causal"},
                  "expected": expected})  # fmt: skip


def vit_tutorial() -> Json:
    """The ViT tutorial's ``att = F.softmax(energy, dim=-1) / scaling`` with ``scaling =
    emb_size ** (1/2)``: the unscaled scores' softmax divided by √d_model (x 6 wide, d_k 3)."""
    q6, k6 = (torch.tensor(a) for a in (second.Q6, second.K6))
    att = F.softmax(q6 @ k6.T, dim=-1) / 6 ** (1 / 2)
    return {**second.PROJ6, "expected": {"weights": js(att)}}


def direct_weights(build: Callable[[Tensor, Tensor], Tensor], **rest: Any) -> Json:
    """/attention on test_compare_mistakes' Q, K, V (6 × 4) with the caller's weights."""
    q, k = (torch.tensor(a) for a in (second.Q, second.K))
    return {**second.DIRECT, **rest, "expected": {"weights": js(build(q, k))}}


def sdpa_output(attn_mask: Tensor, **rest: Any) -> Json:
    """SDPA on Q, K, V with a boolean ``attn_mask`` (true = may attend), against a causal
    request (``rest`` may say the mask otherwise); a row the mask leaves empty comes out as
    torch's math path gives it."""
    q, k, v = (torch.tensor(a) for a in (second.Q, second.K, second.V))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    return {**second.DIRECT, "mask": {"type": "causal"}, **rest, "expected": {"output": js(out)}}


def diagonal_masked() -> Json:
    """``scores.masked_fill(torch.triu(ones, diagonal=0).bool(), -inf)``: each query's own key
    hidden too (row 0 keeps no key: NaN there)."""
    q, k = (torch.tensor(a) for a in (second.Q, second.K))
    n = second.N
    scores = (q @ k.T * second.SCALE).masked_fill(torch.triu(torch.ones(n, n), 0).bool(), -np.inf)
    w = F.softmax(scores, dim=-1)
    return {**second.DIRECT, "mask": {"type": "causal"}, "expected": {"weights": js(w)}}


def aligned_upper() -> Json:
    theirs = F.scaled_dot_product_attention(third.Q3, third.K5, third.V5, is_causal=True)
    return tight({**third.aligned("lower_right"), "expected": {"output": js(theirs[0])}})


def granite_unscaled() -> Json:
    config = _config(GraniteConfig, attention_multiplier=MULTIPLIER)
    theirs = _run(modeling_granite, "GraniteAttention", "GraniteRotaryEmbedding", config,
                  seed=41, scaling=HEAD_DIM**-0.5)  # fmt: skip
    return _request(theirs, attention_multiplier=MULTIPLIER,
                    expected={"output": theirs["out"].tolist()}, tolerance=TIGHT)  # fmt: skip


def olmo_unclipped() -> Json:
    theirs = _run(modeling_olmo, "OlmoAttention", "OlmoRotaryEmbedding",
                  _config(OlmoConfig, clip_qkv=None), seed=40)  # fmt: skip
    return _request(theirs, clip_qkv=CLIP, expected={"output": theirs["out"].tolist()},
                    tolerance=TIGHT)  # fmt: skip


def gemma4_scale_one() -> Json:
    """Gemma 4's scale 1 computed with the usual 1/√d_k, in NumPy."""
    rng = np.random.default_rng(41)
    q, k, v = (rng.normal(size=(4, 3)) for _ in range(3))
    s = q @ k.T / np.sqrt(3)
    w = np.exp(s - s.max(axis=1, keepdims=True))
    w /= w.sum(axis=1, keepdims=True)
    return {"q": q.tolist(), "k": k.tolist(), "v": v.tolist(), "scale": 1.0,
            "expected": {"weights": w.tolist()}, "tolerance": TIGHT}  # fmt: skip


def partial(r: int, rotary_dim: int | None) -> Json:
    theirs = third.partial_port(r)
    body = third.layer_request(third.W16, third.X8, mask={"type": "causal"},
                               expected={"output": js(theirs["output"][0])})  # fmt: skip
    if rotary_dim is not None:
        body["rope"] = {"rotary_dim": rotary_dim}
    return tight(body)


def yarn(scaled: bool) -> Json:
    body, w = third.yarn_head(scaled=scaled)
    return tight({**body, "expected": {"weights": js(w)}})


def yarn_gain(times: int) -> Json:
    """YaRN's frequencies with its attention factor on cos and sin ``times`` times (0: left
    out, as a port building cos and sin from inv_freq alone; 2: applied twice, as a port that
    multiplies cos and sin by mscale where the table it reads already carries it)."""
    q, k, v = (third.randn(1, 1, 8, 8, seed=s) for s in (111, 112, 113))
    at = torch.arange(8)
    inv, gain = third.hf_rope(third.YARN_HF, 8, 8)
    g = gain**times
    scores = third.rope_scaled(q, at, inv, g) @ third.rope_scaled(k, at, inv, g).transpose(-1, -2)
    w = F.softmax(scores / 8**0.5, dim=-1)
    body = third.direct(q[0], k[0], v[0]) | {"rope": {"scaling": third.YARN}}
    return tight({**body, "expected": {"weights": js(w[0, 0])}})


def mla_without_mscale() -> Json:
    """transformers' DeepseekV3Attention (float64, harness.hf_mla's YaRN config: factor 40,
    mscale_all_dim 1) with its ``scaling`` set to qk_head_dim^−½, as a port that computes the
    softmax scale as Llama does and leaves out YaRN's mscale² (the layer's
    ``yarn_apply_mscale``); the request says what the config says."""
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as modeling

    from harness.hf_mla import _config as mla_config
    from harness.hf_reference import CAUSAL, _fill
    from harness.hf_today import _inputs, _run

    yarn = {"factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}
    config = mla_config(
        q_lora_rank=6, rope_dim=8, interleave=True, bias=False, max_position_embeddings=40 * 64,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, **yarn,
                         "original_max_position_embeddings": 64},
    )  # fmt: skip
    config._attn_implementation = "eager"
    attn = modeling.DeepseekV3Attention(config, 0).double().eval()
    rng = np.random.default_rng(42)
    _fill(attn, lambda *shape, scale=1.0: np.round(rng.normal(size=shape) * scale, 6))
    x, allowed = _inputs(lambda *shape: rng.normal(size=shape), config, None, 5, CAUSAL)
    head = config.qk_nope_head_dim + config.qk_rope_head_dim
    assert attn.scaling > 1.5 * head**-0.5  # mscale² = (0.1·ln 40 + 1)² ≈ 1.87
    attn.scaling = head**-0.5  # the bug
    at = list(range(64, 69))
    pos = torch.tensor(at)[None]
    out, _ = _run(modeling, attn, x, allowed, float64=True,
                  embeddings=lambda: modeling.DeepseekV3RotaryEmbedding(config)(x, pos))  # fmt: skip
    mla = {"q_lora_rank": 6, "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 8,
           "v_head_dim": 6, "eps": 1e-6}  # fmt: skip
    rope = {"base": 10000.0, "style": "interleaved",
            "scaling": {"type": "yarn", **yarn, "original_max_position": 64}}  # fmt: skip
    state = {k: v.detach().numpy().tolist() for k, v in attn.state_dict().items()}
    return tight({"x": x[0].numpy().tolist(), "num_heads": 2, **state, "mla": mla, "rope": rope,
                  "mask": {"type": "causal"}, "positions": at, "context_positions": at,
                  "expected": {"output": out["output"][0].numpy().tolist()}})  # fmt: skip


def llama31_as_llama3() -> Json:
    body = port8(500_000.0)
    return {**body, "rope": {"base": 500_000, "scaling": third.LLAMA31}}


def low_precision(dtype: Any, **kw: Any) -> Json:
    return plain(kernel_body(kernel(dtype, **kw)))  # type: ignore[no-any-return]


# ---- the corpus ------------------------------------------------------------------------------


def row(id: str, source: str, endpoint: str, body: Json, *expect: str) -> Row:
    return Row(id, source, endpoint, body, tuple(expect))


def case_row(id: str, source: str, case_id: str, *expect: str) -> Row:
    endpoint, body = second_case(case_id)
    return row(id, source, endpoint, body, *expect)


LECTURE = 'karpathy/ng-video-lecture ("Let\'s build GPT")'
DECODE = "/multihead"


@cache
def corpus() -> tuple[Row, ...]:
    """Every row, built once."""
    q_print_mistake = {**PRINTED_BODY, "expected": {"weights": torch_print(weights(axis=0))}}
    return (
        # ---- printed slips and prints of course numbers
        row(
            "batman-k-typed-1.4-for-1.5",
            'the README\'s "I am Batman" by hand: K = X W_kᵀ '
            "holds 1.5, a student typed 1.4 (issue 42)",
            "/attention",
            batman_slip("k", (0, 1)),
            DIFFERS,
        ),
        row(
            "batman-q-entry-0.1-off",
            'the README\'s "I am Batman" by hand: a Q entry 0.1 off at 1 decimal (issue 42)',
            "/attention",
            batman_slip("q", (2, 1)),
            DIFFERS,
        ),
        row(
            "print-2-decimals",
            "a notebook's NumPy print of the right weights at precision=2",
            "/attention",
            printed_weights(2),
            MATCH,
        ),
        row(
            "print-4-decimals-torch",
            "torch's default print (4 decimals) of the right weights",
            "/attention",
            {**PRINTED_BODY, "expected": {"weights": torch_print(weights())}},
            MATCH,
        ),
        row(
            "print-8-decimals-numpy",
            "NumPy's default print (8 decimals) of the right weights",
            "/attention",
            printed_weights(8),
            MATCH,
        ),
        row(
            "float64-exact",
            "the right weights in float64, as computed (never printed)",
            "/attention",
            {**PRINTED_BODY, "expected": {"weights": weights().tolist()}},
            MATCH,
        ),
        row(
            "printed-softmax-over-queries",
            "labmlai/annotated_deep_learning_paper_implementations#146 (the softmax over the "
            "query axis), printed by torch at 4 decimals",
            "/attention",
            q_print_mistake,
            "softmax_over_queries",
        ),
        row(
            "course-notebook-axis0-and-scale-after",
            "a course notebook: np.exp(scores) / "
            "np.exp(scores).sum(axis=0) / np.sqrt(d_k), printed at 4 decimals (docs/api.md 2.7)",
            "/attention",
            course_notebook(),
            "softmax_over_queries",
            "scale_after_softmax",
        ),
        # ---- decode steps rotated at the wrong positions (transformers' LlamaAttention)
        row(
            "decode-one-token-at-0",
            "Blaizzy/mlx-vlm#1983 (decode assigns RoPE position 0 to "
            "every token; rope_missing fits too)",
            DECODE,
            llama_step([0], tokens=6, seed=12),
            "decode_position_offset",
        ),
        row(
            "decode-two-tokens-from-0",
            "RobertCsordas/moeut#6 (the RoPE offset taken before "
            "the cache was concatenated: new tokens from position 0)",
            DECODE,
            llama_step([0, 1]),
            "decode_position_offset",
        ),
        row(
            "decode-one-ahead",
            "fla-org/flash-linear-attention#766 (the seen-token count "
            "committed too early: positions one ahead)",
            DECODE,
            llama_step([6, 7]),
            "decode_position_offset",
        ),
        row(
            "decode-window-at-one-position",
            "jundot/omlx#2363 (a multi-token decode window rotated at its first position)",
            DECODE,
            llama_step([5, 5]),
            "decode_position_offset",
        ),
        row(
            "decode-left-padding-counted",
            "unslothai/unsloth#3795 (issue #3699: cache_position "
            "used as position_ids in a left-padded batch)",
            DECODE,
            llama_step([8, 9]),
            "decode_position_offset",
        ),
        row(
            "decode-offset-jump",
            "skyzh/tiny-llm#46 (the offset advanced by the prompt's length again: 6 → 12)",
            DECODE,
            llama_step([10, 11]),
            "decode_position_offset",
        ),
        row(
            "decode-padding-and-unscaled",
            "unslothai/unsloth#3699's positions in a port that also forgot 1/√d_k",
            DECODE,
            llama_step([8, 9], scaling=1.0),
            "scale_missing",
            "decode_position_offset",
        ),
        row(
            "decode-right",
            "transformers' LlamaAttention with its DynamicCache, positions 5, 6",
            DECODE,
            llama_step(None),
            MATCH,
        ),
        # ---- grouped-query heads
        row(
            "gqa-tile",
            "onnx/onnx#7274 (the grouped KV heads repeated with Tile where torch "
            "uses repeat_interleave): a Llama port with 8 heads and 2 KV heads",
            "/multihead",
            kv_tiled(),
            "kv_heads_repeated_wrong",
        ),
        row(
            "gqa-np-tile",
            "onnx/onnx#7274 (ONNX's NumPy reference Attention, np.tile)",
            "/multihead",
            kv_tiled_numpy(),
            "kv_heads_repeated_wrong",
        ),
        row(
            "gqa-tile-decode",
            "apple/axlearn#842 (the same repeat confusion) in a decode step with its cache",
            "/multihead",
            cache_step(tile=True),
            "kv_heads_repeated_wrong",
        ),
        row(
            "gqa-tile-meta-rope",
            "a port keeping Meta's apply_rotary_emb on Hugging Face "
            "weights and writing k.repeat for repeat_kv",
            "/multihead",
            meta_rope_tiled(),
            "rope_style_swapped",
            "kv_heads_repeated_wrong",
        ),
        row(
            "gqa-right",
            "SDPA's enable_gqa=True (repeat_kv's layout)",
            "/multihead",
            gqa_right(),
            MATCH,
        ),
        # ---- sliding windows
        row(
            "window-sdpa-is-causal",
            "huggingface/transformers#28980 (Mistral's SDPA path: "
            "is_causal=True, no sliding window)",
            "/multihead",
            sliding(third.sdpa(is_causal=True)),
            "window_missing",
        ),
        row(
            "chunked-as-causal",
            "Llama 4's chunked attention (attention_chunk_size) run as a plain causal SDPA",
            "/mask",
            chunked_as_causal(),
            "window_missing",
        ),
        row(
            "gemma2-27b-port",
            "huggingface/transformers#28980's SDPA path on Gemma 2 27B, with "
            "SDPA's default scale for query_pre_attn_scalar (keras-team/keras-hub#1701)",
            "/multihead",
            gemma2_27b_port(),
            "scale_from_config_ignored",
            "window_missing",
        ),
        case_row(
            "window-flash-size-W",
            "flash-attention's window_size = (W, 0) for Hugging "
            "Face's sliding_window = W: one key wider",
            "window_off_by_one-sliding_window-one_wider",
            "window_off_by_one",
        ),
        row(
            "window-right",
            "the band given to SDPA as attn_mask (huggingface/transformers#30127)",
            "/multihead",
            sliding(third.sdpa(attn_mask=third.band(third.L6, 2))),
            MATCH,
        ),
        # ---- RoPE bases
        case_row(
            "rope-theta-20000",
            "a stock LlamaAttention built with rope_theta 20000 where 10000 was asked (issue 42)",
            "rope_base_wrong-llama-layer_built_with_20000",
            "rope_base_wrong",
        ),
        row(
            "rope-starcoder2-base",
            "a Llama port run with StarCoder2's rope_theta 100000 where 10000 was asked",
            "/multihead",
            port8(100_000.0),
            "rope_base_wrong",
        ),
        case_row(
            "rope-default-for-llama3",
            "a LlamaAttention built with the default 10000 where the config says 500000",
            "rope_base_wrong-llama-layer_built_with_10000",
            "rope_base_wrong",
        ),
        case_row(
            "rope-never-applied",
            "RoPE asked (base 500000), q and k never rotated",
            "rope_missing-weights",
            "rope_missing",
        ),
        # ---- the output projection
        row(
            "lecture-no-proj",
            f"{LECTURE}: MultiHeadAttention returning torch.cat of the heads before self.proj",
            "/multihead",
            lecture(4, project=False),
            "output_projection_missing",
        ),
        row(
            "lecture-no-proj-scaled-by-n-embd",
            f"{LECTURE} PR #6 (scaled by C = n_embd) with the heads returned without self.proj",
            "/multihead",
            lecture(8, project=False),
            "scale_by_model_dim",
            "output_projection_missing",
        ),
        row(
            "lecture-right",
            f"{LECTURE}: the layer with self.proj",
            "/multihead",
            lecture(4, project=True),
            MATCH,
        ),
        # ---- the softmax's axis
        row(
            "softmax-without-dim",
            "pytorch/pytorch#5733 (F.softmax without dim picks dim 0 of [B][L][S] scores)",
            "/attention",
            over_batch(0.5),
            "softmax_over_batch",
        ),
        row(
            "luong-without-dim",
            "Luong-style dot attention (torch.bmm, no scale) with F.softmax and no dim",
            "/attention",
            over_batch(1.0),
            "scale_missing",
            "softmax_over_batch",
        ),
        # ---- finite mask fills
        row(
            "fill-minus-epsilon",
            "hyunwoongko/transformer#10 (masked_fill(mask == 0, -e), e = 1e-12)",
            "/mask",
            fill_causal(-1e-12),
            "mask_not_infinite",
        ),
        row(
            "fill-multiplied-by-tril",
            "a notebook masking by multiplying the scores with the "
            "0/1 tril matrix (masked scores 0)",
            "/mask",
            mask_multiplied(),
            "mask_not_infinite",
        ),
        row(
            "fill-finfo-min-left-padded",
            "transformers' torch.finfo(dtype).min fill on a "
            "left-padded batch (its first rows see no key: uniform)",
            "/mask",
            fill_left_padded(float(torch.finfo(torch.float32).min)),
            "mask_not_infinite",
        ),
        row(
            "fill-gpt2-1e4-left-padded",
            "GPT-2's masked_bias −1e4 (transformers' GPT2Attention "
            "before 4.x's finfo.min) on a left-padded batch",
            "/mask",
            fill_left_padded(-1e4),
            "mask_not_infinite",
        ),
        row(
            "fill-gpt2-1e4-causal",
            "GPT-2's masked_bias −1e4 where every row keeps a key: the same weights as −∞",
            "/mask",
            fill_causal(-1e4),
            MATCH,
        ),
        row(
            "tril-unscaled",
            f"{LECTURE}'s first cell (no scale) masked with torch.tril(wei) "
            "(rasbt/LLMs-from-scratch#279)",
            "/mask",
            tril_unscaled(),
            "scale_missing",
            "mask_not_infinite",
        ),
        row(
            "annotated-transformer-1e9",
            "the Annotated Transformer's masked_fill(mask == 0, "
            "-1e9) (harvardnlp/annotated-transformer#67)",
            "/mask",
            annotated_transformer(),
            MATCH,
        ),
        # ---- scale mistakes
        row(
            "vit-tutorial-scale-after-softmax-by-d-model",
            "the ViT tutorial's F.softmax(energy)"
            " / emb_size ** (1/2), copied into many repositories (FrancescoSaverioZuppichini/ViT"
            "#2, #6; issue 42's tutorial pair)",
            "/attention",
            vit_tutorial(),
            "scale_after_softmax",
            "scale_by_model_dim",
        ),
        row(
            "scale-after-softmax",
            "FrancescoSaverioZuppichini/ViT#2 (att = F.softmax(energy) * self.scaling)",
            "/attention",
            direct_weights(lambda q, k: F.softmax(q @ k.T, dim=-1) * second.SCALE),
            "scale_after_softmax",
        ),
        case_row(
            "scale-by-embed-size",
            "aladdinpersson/Machine-Learning-Collection#65 (softmax(energy / embed_size ** (1/2)))",
            "scale_by_model_dim-multihead-sqrt_d_model",
            "scale_by_model_dim",
        ),
        row(
            "scale-by-d-k",
            "delzac/cntkx#10 (the scores divided by d_k, no square root)",
            "/attention",
            direct_weights(lambda q, k: F.softmax(q @ k.T / second.D_K, dim=-1)),
            "scale_by_d_k",
        ),
        row(
            "scale-missing",
            "huggingface/blog#2893 (kv-cache.md's attention without 1/√d_k)",
            "/attention",
            direct_weights(lambda q, k: F.softmax(q @ k.T, dim=-1)),
            "scale_missing",
        ),
        case_row(
            "scale-inverted",
            "scores * math.sqrt(d_k) where / math.sqrt(d_k) was meant",
            "scale_inverted-times_sqrt_d_k",
            "scale_inverted",
        ),
        # ---- the second edition's masks, heads and batches
        row(
            "sdpa-triu-mask",
            "rasbt/LLMs-from-scratch#1061 (torch.triu(…, 1).bool() handed "
            "to SDPA, whose true means attend)",
            "/mask",
            sdpa_output(torch.triu(torch.ones(second.N, second.N), 1).bool()),
            "mask_inverted",
        ),
        row(
            "sdpa-triu-mask-as-boolean",
            "rasbt/LLMs-from-scratch#1061, the request giving the "
            "causal mask meant as a boolean matrix (tril, true = may attend)",
            "/mask",
            sdpa_output(
                torch.triu(torch.ones(second.N, second.N), 1).bool(),
                mask=second.boolean(second.causal(second.N)),
            ),
            "mask_inverted",
        ),
        row(
            "triu-diagonal-0",
            "a notebook masking with torch.triu(ones, diagonal=0) where diagonal=1 was meant",
            "/mask",
            diagonal_masked(),
            "causal_diagonal_masked",
        ),
        case_row(
            "eager-llama-no-mask",
            "transformers' eager LlamaAttention called with "
            "attention_mask=None (a port dropping the mask)",
            "mask_missing-llama-eager-attention_mask_None",
            "mask_missing",
        ),
        case_row(
            "mask-after-softmax-zeroed",
            "the masked weights zeroed after the softmax, rows not renormalised",
            "mask_after_softmax-causal-zeroed",
            "mask_after_softmax",
        ),
        case_row(
            "mask-after-softmax-renormalised",
            "abisee/pointer-generator#88 (softmax, "
            "then the mask, then re-normalised; NaN in a row with no key)",
            "mask_after_softmax-renormalised-empty_row_nan",
            "mask_after_softmax",
        ),
        case_row(
            "heads-merged-without-transpose",
            "(B, h, L, d) reshaped to (B, L, h·d) without .transpose(1, 2)",
            "heads_merged_without_transpose-concat",
            "heads_merged_without_transpose",
        ),
        case_row(
            "mha-batch-first-false",
            "nn.MultiheadAttention without batch_first=True fed (B, L, E) tensors",
            "batch_as_sequence-nn.MultiheadAttention-batch_first_False",
            "batch_as_sequence",
        ),
        case_row(
            "stock-llama-float64-tight",
            "transformers' float64 LlamaAttention (RoPE "
            "tables and softmax in float32) compared at 1e-12",
            "float32_arithmetic-llama-stock_float64_layer",
            "float32_arithmetic",
        ),
        # ---- causal alignment
        row(
            "sdpa-is-causal-l-ne-s",
            "pytorch/pytorch#144858 (is_causal=True aligns upper-left "
            "when L ≠ S) where lower-right was asked",
            "/mask",
            aligned_upper(),
            "causal_alignment_swapped",
        ),
        row(
            "decode-sdpa-is-causal",
            "karpathy/nanochat#456 (SDPA's is_causal=True in a decode step with a KV cache)",
            "/multihead",
            cache_step(is_causal=True),
            "causal_alignment_swapped",
        ),
        row(
            "decode-cache-ignored-twice",
            "a decode loop ignoring cache_position everywhere: "
            "position_ids = arange(L) and is_causal=True",
            "/multihead",
            cache_step(is_causal=True, from_zero=True),
            "decode_position_offset",
            "causal_alignment_swapped",
        ),
        # ---- a layer's own config ignored
        row(
            "granite-multiplier-ignored",
            "a Granite port scaled by head_dim ** -0.5 as Llama (attention_multiplier left out)",
            "/multihead",
            granite_unscaled(),
            "scale_from_config_ignored",
        ),
        row(
            "olmo-clip-ignored",
            "an OLMo layer run without clip_qkv",
            "/multihead",
            olmo_unclipped(),
            "clip_missing",
        ),
        row(
            "gemma4-scale-one",
            "Gemma 4's scale 1 computed with the usual 1/√d_k",
            "/attention",
            gemma4_scale_one(),
            "scale_from_config_ignored",
        ),
        # ---- partial rotary
        row(
            "llama-rope-on-pythia-head",
            "Llama's apply_rotary_pos_emb on a GPT-NeoX head (rotary_pct 0.25)",
            "/multihead",
            partial(8, 2),
            "partial_rotary_wrong",
        ),
        row(
            "chatglm-half-rotation",
            "ChatGLM's partial_rotary_factor 0.5 kept for a Llama head",
            "/multihead",
            partial(4, None),
            "partial_rotary_wrong",
        ),
        row(
            "partial-right",
            "GPT-NeoX's rotation of the first rotary_ndims features",
            "/multihead",
            partial(2, 2),
            MATCH,
        ),
        # ---- RoPE scaling
        row(
            "yarn-left-out",
            "a cell building RoPE's default table for a YaRN config (Qwen2.5 long context)",
            "/attention",
            yarn(scaled=False),
            "rope_scaling_missing",
        ),
        row(
            "yarn-factor-left-out",
            "YaRN's frequencies with cos and sin built from inv_freq "
            "alone (transformers' attention_scaling left out)",
            "/attention",
            yarn_gain(0),
            "rope_scaling_missing",
        ),
        row(
            "yarn-factor-twice",
            "YaRN's attention factor applied twice on cos and sin (issue 42)",
            "/attention",
            yarn_gain(2),
            "rope_scaling_missing",
        ),
        row(
            "mla-mscale-squared-left-out",
            "DeepSeek V3's MLA under YaRN with the softmax "
            "scale qk_head_dim^−½, its mscale² left out (the layer's yarn_apply_mscale; "
            "issue 42)",
            "/multihead",
            mla_without_mscale(),
            "scale_from_config_ignored",
        ),
        row(
            "llama31-as-llama3",
            "a Llama 3 port on Llama 3.1 weights without rope_scaling "
            "llama3 (llama.cpp's first Llama 3.1 runs)",
            "/multihead",
            llama31_as_llama3(),
            "rope_scaling_missing",
        ),
        row(
            "yarn-right",
            "transformers' YaRN frequencies and attention factor",
            "/attention",
            yarn(scaled=True),
            MATCH,
        ),
        # ---- low-precision kernels
        row(
            "sdpa-bfloat16",
            "torch's SDPA in bfloat16 (a correct kernel)",
            "/attention",
            low_precision(torch.bfloat16),
            MATCH,
        ),
        row(
            "sdpa-float16",
            "torch's SDPA in float16 (a correct kernel)",
            "/attention",
            low_precision(torch.float16),
            MATCH,
        ),
        row(
            "sdpa-float32-named",
            "torch's SDPA in float32, tolerance.precision float32",
            "/attention",
            {**low_precision(torch.float32), "tolerance": {"precision": "float32"}},
            MATCH,
        ),
        row(
            "bfloat16-scale-1",
            "a bfloat16 kernel that forgot 1/√d_k (scale=1.0)",
            "/attention",
            low_precision(torch.bfloat16, scale=1.0),
            "scale_missing",
        ),
        row(
            "bfloat16-not-causal",
            "a bfloat16 kernel without its causal mask",
            "/attention",
            low_precision(torch.bfloat16, causal=False),
            "mask_missing",
        ),
    )


# ---- the verdict and the measure ---------------------------------------------------------------

RIGHT, FALSE_MATCH, WRONG_NAME = "right", "false match", "wrong name"
NOT_NAMED, FALSE_ALARM, ERROR = "not named", "false alarm", "error"
VERDICTS = (RIGHT, FALSE_MATCH, WRONG_NAME, NOT_NAMED, FALSE_ALARM, ERROR)


@dataclass(frozen=True)
class Outcome:
    row: Row
    got: str  # "match", the codes named ("a+b"), "differs (none named)", or the error
    verdict: str
    message: str


def judge(r: Row, status: int, answer: Json) -> Outcome:
    """The row's verdict from the service's answer."""
    if status != 200:
        return Outcome(r, f"HTTP {status}", ERROR, str(answer)[:300])
    first = answer.get("first_mismatch")
    if first is None:
        verdict = RIGHT if r.expect == (MATCH,) else FALSE_MATCH
        return Outcome(r, MATCH, verdict, "")
    [e] = [e for e in answer["comparison"] if e["name"] == first]
    found = e["diagnosis"]
    got = "differs (none named)" if found is None else "+".join(found["mistakes"])
    if found is not None and found.get("alternatives"):
        got += " (alt " + ", ".join("+".join(a) for a in found["alternatives"]) + ")"
    if r.expect == (MATCH,):
        verdict = FALSE_ALARM
    elif found is None:
        verdict = RIGHT if r.expect == (DIFFERS,) else NOT_NAMED
    else:
        verdict = RIGHT if tuple(found["mistakes"]) == r.expect else WRONG_NAME
    return Outcome(r, got, verdict, e["message"])


_OUTCOMES: dict[str, Outcome] = {}


def outcome(client: TestClient, r: Row) -> Outcome:
    """The row sent once (per process) and judged."""
    if r.id not in _OUTCOMES:
        answer = client.post(r.endpoint, json=r.body)
        _OUTCOMES[r.id] = judge(r, answer.status_code, answer.json())
    return _OUTCOMES[r.id]


def table(outcomes: list[Outcome]) -> str:
    """The tally table: one line per row, then the counts."""
    lines = [
        "| # | row | source | expected | got | verdict |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for n, o in enumerate(outcomes, 1):
        r = o.row
        lines.append(f"| {n} | {r.id} | {r.source} | {r.expected_text} | {o.got} | {o.verdict} |")
    counts = {v: sum(o.verdict == v for o in outcomes) for v in VERDICTS}
    total = len(outcomes)
    lines.append("")
    lines.append(
        f"{counts[RIGHT]} right ({100 * counts[RIGHT] / total:.1f} %), "
        f"{counts[FALSE_MATCH]} false matches, {counts[WRONG_NAME]} wrong names, "
        f"{counts[NOT_NAMED]} not named, {counts[FALSE_ALARM]} false alarms, "
        f"{counts[ERROR]} errors, out of {total}"
    )
    return "\n".join(lines)


# Rows the service does not yet give their verdict (kept as they are: the measure counts them).
KNOWN: dict[str, str] = {}


def params() -> list[Any]:
    marks = {rid: pytest.mark.xfail(strict=True, reason=why) for rid, why in KNOWN.items()}
    return [pytest.param(r, id=r.id, marks=marks.get(r.id, ())) for r in corpus()]


@pytest.mark.parametrize("r", params())
def test_each_row_gets_its_verdict(client: TestClient, r: Row) -> None:
    got = outcome(client, r)
    assert got.verdict == RIGHT, (r.source, r.expected_text, got.got, got.message)


def test_the_corpus_measure(client: TestClient) -> None:
    """Issue 42's goal over the whole corpus: no false match, no wrong name, ≥ 90 % right."""
    outcomes = [outcome(client, r) for r in corpus()]
    print("\n" + table(outcomes))
    verdicts = [o.verdict for o in outcomes]
    assert len(outcomes) >= 49
    assert verdicts.count(FALSE_MATCH) == 0, [
        o.row.id for o in outcomes if o.verdict == FALSE_MATCH
    ]
    assert verdicts.count(WRONG_NAME) == 0, [
        (o.row.id, o.got) for o in outcomes if o.verdict == WRONG_NAME
    ]
    assert verdicts.count(ERROR) == 0
    assert verdicts.count(RIGHT) >= 0.9 * len(outcomes), verdicts.count(RIGHT)


def test_the_rows_are_unique_and_their_codes_are_the_tables() -> None:
    """Each row once; each expected code one of docs/api.md's table (as the compare tests list
    it), in the table's order."""
    rows = corpus()
    assert len({r.id for r in rows}) == len(rows)
    at = second.CODES.index("rope_base_wrong") + 1
    order = (*second.CODES[:at], "decode_position_offset", *second.CODES[at:], *THIRD_CODES)
    for r in rows:
        if r.expect in ((MATCH,), (DIFFERS,)):
            continue
        assert all(c in order for c in r.expect), r
        assert list(r.expect) == sorted(r.expect, key=order.index), r


def test_builder_the_bugs_written_here_are_the_right_computation_without_them() -> None:
    """Each bug written in this file, removed, gives the right numbers (float64 torch or NumPy
    references written elsewhere): so only the bug separates the row from the right one."""
    q, k, v = (torch.tensor(a) for a in (second.Q, second.K, second.V))
    right = second.attend(second.Q, second.K, second.V, second.SCALE, second.causal(second.N))
    # SDPA's attn_mask given tril (not triu) is the causal attention
    tril = torch.tril(torch.ones(second.N, second.N)).bool()
    ours = F.scaled_dot_product_attention(q, k, v, attn_mask=tril).numpy()
    np.testing.assert_allclose(ours, right["output"], atol=1e-12)
    # the ViT tutorial's line with the scale before the softmax, over d_k, is the right weights
    q6, k6 = (torch.tensor(a) for a in (second.Q6, second.K6))
    fixed = F.softmax(q6 @ k6.T / 3 ** (1 / 2), dim=-1).numpy()
    np.testing.assert_allclose(
        fixed, second.attend(second.Q6, second.K6, second.V6, 3**-0.5)["weights"], atol=1e-12
    )
    # YaRN's factor once is transformers' YaRN (the row that matches)
    once = yarn_gain(1)["expected"]["weights"]
    np.testing.assert_allclose(once, yarn(scaled=True)["expected"]["weights"], atol=1e-12)
    assert np.abs(np.array(yarn_gain(2)["expected"]["weights"]) - np.array(once)).max() > 1e-2
    # a multiplied tril mask differs from −∞ only where the mask hides a key
    q1, k1, _ = one_item()
    scores = q1 @ k1.transpose(-2, -1) * 0.5
    hidden = ~third.causal_mask(third.L6)
    infinite = F.softmax(scores.masked_fill(hidden, -np.inf), dim=-1)
    np.testing.assert_allclose(
        F.softmax(scores.masked_fill(hidden, 0.0), dim=-1).numpy(),
        F.softmax(scores * torch.tril(torch.ones(third.L6, third.L6)), dim=-1).numpy(),
        atol=1e-15,
    )
    assert (F.softmax(scores * ~hidden, dim=-1)[0][hidden] > 1e-3).all()
    assert not infinite[0][hidden].any()


THIRD_CODES = (  # the table's after float32_arithmetic (decode_position_offset comes before it)
    "scale_from_config_ignored",
    "clip_missing",
    "kv_heads_repeated_wrong",
    "window_missing",
    "output_projection_missing",
    "softmax_over_batch",
    "causal_alignment_swapped",
    "mask_not_infinite",
    "partial_rotary_wrong",
    "rope_scaling_missing",
)


def main() -> int:
    """Print the table for every row (``python -m tests.api.test_mistake_corpus``)."""
    import logging

    from service.config import Settings
    from service.http.app import create_app

    logging.getLogger("service.access").disabled = True
    with TestClient(create_app(Settings())) as client:
        outcomes = [outcome(client, r) for r in corpus()]
    print(table(outcomes))
    bad = [o for o in outcomes if o.verdict != RIGHT]
    for o in bad:
        print(f"\n{o.row.id}: {o.verdict}; got {o.got}\n  {o.message}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
