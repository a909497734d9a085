"""The third edition's new mistake codes (API.md, "Compare, third edition: never a false match";
docs/api.md's table), each recognised alone and with a code of an earlier edition where real code
makes both, through the ASGI app.

Where each number comes from (never from the service's own functions: ``service`` is not
imported here): the caller's arrays are made the way each mistake really happens, by torch or
NumPy code written in this file — a port of a layer that calls
``F.scaled_dot_product_attention`` (``port``), NumPy attention as a notebook writes it
(``notebook``) — each builder checked against the right computation with its mistake removed
(``test_builder_*``), so that only the mistake separates the caller's numbers from the right
ones. The source of each mistake (a public issue, a tutorial, a library's documented
behaviour) is named in its test's docstring. What the diagnosis must say is the contract's: the
codes the builder's mistakes are, in the table's order.

torch is required (the file skips without it, as the other live cross-checks do;
``REQUIRE_TORCH`` makes that a failure).
"""

import os
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from fastapi.testclient import TestClient

if os.environ.get("REQUIRE_TORCH"):  # CI sets it: a missing torch must fail, not skip
    import torch
torch = pytest.importorskip("torch", reason="PyTorch is not installed (torch==2.13.0)")

from tests.api.test_compare_mistakes import js, post  # noqa: E402

pytestmark = pytest.mark.torch

Array = npt.NDArray[np.float64]
Bool = npt.NDArray[np.bool_]
Json = dict[str, Any]
Tensor = Any  # torch.Tensor (torch comes through importorskip, so typed as a module)
F64 = torch.float64
F = torch.nn.functional
TIGHT: Json = {"atol": 1e-10, "rtol": 0}  # float64 agreement


# ---- HTTP and JSON -----------------------------------------------------------------------


def diagnosed(client: TestClient, path: str, body: Json, name: str) -> Json:
    """The diagnosis of ``name``, the first mismatch (every other entry has none)."""
    got = post(client, path, {"tolerance": TIGHT, **body})
    assert got["first_mismatch"] == name, got["comparison"]
    [e] = [e for e in got["comparison"] if e["name"] == name]
    assert e["match"] is False and e["diagnosis"] is not None, e
    assert e["diagnosis_complete"] is True, e
    for other in got["comparison"]:
        if other["name"] != name:
            assert other["diagnosis"] is None, other
    return e["diagnosis"]  # type: ignore[no-any-return]


def matches(client: TestClient, path: str, body: Json) -> None:
    """Right numbers match: no mismatch, no diagnosis (never a false match)."""
    got = post(client, path, {"tolerance": TIGHT, **body})
    assert got["first_mismatch"] is None, got["comparison"]
    assert all(e["match"] and e["diagnosis"] is None for e in got["comparison"])


# ---- the builders: torch and NumPy written here ---------------------------------------------

Attend = Callable[[Tensor, Tensor, Tensor], Tensor]  # (B, h, L, d) q, k, v -> (B, h, L, d_v)


def rope(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    """RoPE as Llama's ``apply_rotary_pos_emb`` with ``rotate_half`` (feature i pairs with
    i + d/2), its tables in float64: x (…, n, d) at ``positions`` (n,)."""
    d = x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=F64) / d)  # (d/2,)
    angle = positions.to(F64)[:, None] * inv[None, :]  # (n, d/2)
    emb = torch.cat([angle, angle], dim=-1)  # (n, d)
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    return x * emb.cos() + half * emb.sin()


def sdpa(**kw: Any) -> Attend:
    """``F.scaled_dot_product_attention`` with these keywords (is_causal, attn_mask, scale)."""
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kw)


def port(
    x: Tensor,
    w: dict[str, Tensor],
    h: int,
    attend: Attend,
    *,
    h_kv: int | None = None,
    base: float | None = 10000.0,
    rotate: Callable[[Tensor, Tensor, float], Tensor] | None = None,
    tile: bool = False,
) -> dict[str, Tensor]:
    """A Llama-style attention layer as ports write it: ``nn.Linear`` (out, in) weights ``w``
    (q, k, v, o; ``o_bias`` optional), the heads split as ``view(B, L, h, d).transpose(1, 2)``,
    RoPE at 0 … L − 1 (``base`` None: none), key/value heads repeated as transformers'
    ``repeat_kv`` (each serves consecutive query heads; ``tile``: ``k.repeat(1, g, 1, 1)``
    instead), ``attend`` per head, the heads put back with ``transpose(1, 2).reshape(B, L, h·d)``
    and projected by W_o. ``rotate``: another RoPE (Meta's interleaved one)."""
    b, n, _ = x.shape
    h_kv = h if h_kv is None else h_kv

    def heads(t: Tensor, count: int) -> Tensor:  # (B, L, count·d) -> (B, count, L, d)
        return t.view(b, n, count, -1).transpose(1, 2)

    q, k, v = heads(x @ w["q"].T, h), heads(x @ w["k"].T, h_kv), heads(x @ w["v"].T, h_kv)
    if base is not None:
        at, turn = torch.arange(n), rope if rotate is None else rotate
        q, k = turn(q, at, base), turn(k, at, base)
    if h_kv != h:
        k, v = grouped(k, h // h_kv, tile), grouped(v, h // h_kv, tile)
    out = attend(q, k, v)  # (B, h, L, d_v)
    concat = out.transpose(1, 2).reshape(b, n, -1)
    return {"concat": concat, "output": F.linear(concat, w["o"], w.get("o_bias"))}


def grouped(t: Tensor, g: int, tile: bool = False) -> Tensor:
    """(B, h_kv, n, d) keys or values for h = g·h_kv query heads: transformers' ``repeat_kv``
    (``expand`` then ``reshape``: key/value head j serves query heads j·g … j·g + g − 1), or with
    ``tile`` a port's ``t.repeat(1, g, 1, 1)`` (query head i gets key/value head i mod h_kv)."""
    if tile:
        return t.repeat(1, g, 1, 1)
    b, h_kv, n, d = t.shape
    return t[:, :, None].expand(b, h_kv, g, n, d).reshape(b, h_kv * g, n, d)


def band(n: int, left: int) -> Tensor:
    """A sliding window as transformers' ``sliding_window_causal`` mask with W = left + 1: key j
    visible from query i when i − left ≤ j ≤ i (true = may attend, as attn_mask takes it)."""
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    return (j <= i) & (j >= i - left)


def randn(*shape: int, seed: int) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def direct(q: Tensor, k: Tensor, v: Tensor) -> Json:
    """A direct-mode request for one unbatched (1, n, d) Q, K, V."""
    return {"q": js(q[0]), "k": js(k[0]), "v": js(v[0])}


def weights_of(rows: int, cols: int, seed: int) -> Tensor:
    """An nn.Linear-style (out, in) float64 weight, N(0, 1/in)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g, dtype=F64) * cols**-0.5


# A small Llama/Mistral-style layer: d_model 8, 2 heads of 4, L = 6 tokens
L6, D8 = 6, 8
X = randn(1, L6, D8, seed=31)
W = {p: weights_of(8, 8, 40 + i) for i, p in enumerate("qkvo")}


def layer_request(w: dict[str, Tensor], x: Tensor = X, **rest: Any) -> Json:
    """The /multihead request for ``port``'s layer: the state dict's names, RoPE base 10⁴."""
    names = {"q": "q_proj.weight", "k": "k_proj.weight", "v": "v_proj.weight"}
    names |= {"o": "o_proj.weight", "o_bias": "o_proj.bias"}
    return {
        "x": js(x[0]),
        "num_heads": 2,
        "rope": {"base": 10000},
        **{names[p]: js(t) for p, t in w.items()},
        **rest,
    }


# ---- window_missing --------------------------------------------------------------------------

SLIDING: Json = {"mask": [{"type": "causal"}, {"type": "window", "left": 2, "right": 0}]}


def test_a_mistral_port_through_sdpa_is_causal_is_window_missing(client: TestClient) -> None:
    """transformers #28980 (fixed by #30127): Mistral's SDPA path called
    ``scaled_dot_product_attention(is_causal=True)`` and never applied ``sliding_window``; the
    same port here, sliding_window W = 3 (left = W − 1 = 2)."""
    theirs = port(X, W, 2, sdpa(is_causal=True))["output"]
    body = layer_request(W, **SLIDING, expected={"output": js(theirs[0])})
    d = diagnosed(client, "/multihead", body, "output")
    assert d["mistakes"] == ["window_missing"], d
    text = d["explanation"]
    assert "left = 2" in text and "is_causal=True" in text and "window_size = (2, 0)" in text, text


def test_a_llama4_chunked_layer_run_causal_is_window_missing(client: TestClient) -> None:
    """Llama 4's chunked layers (transformers' ``chunked_causal_mask_function``,
    attention_chunk_size) run as a plain causal layer, as a port through ``is_causal=True`` does:
    query i sees every earlier key, not only those of its own chunk."""
    q, k, v = (randn(1, L6, 4, seed=s) for s in (1, 2, 3))
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    body = {**direct(q, k, v), "mask": [{"type": "chunked", "size": 3}]}
    body["expected"] = {"output": js(theirs[0])}
    d = diagnosed(client, "/mask", body, "output")
    assert d["mistakes"] == ["window_missing"], d
    assert "chunks of 3 positions" in d["explanation"], d["explanation"]


def test_a_gemma2_27b_port_without_window_and_with_the_head_scale_is_a_pair(
    client: TestClient,
) -> None:
    """A Gemma 2 27B port through ``scaled_dot_product_attention(is_causal=True)``: no
    sliding window (transformers #28980's SDPA path) and SDPA's default scale 1/√head_dim where
    Gemma 2 27B scales by query_pre_attn_scalar^−½ = (hidden / heads)^−½ (keras-hub #1701): here
    d_model 12, 2 heads of 4, so the layer's scale is 6^−½."""
    x = randn(1, L6, 12, seed=33)
    w = {p: weights_of(8, 12, 50 + i) for i, p in enumerate("qkv")} | {"o": weights_of(12, 8, 53)}
    theirs = port(x, w, 2, sdpa(is_causal=True))["output"]
    right = port(x, w, 2, sdpa(attn_mask=band(L6, 2), scale=6**-0.5))["output"]
    body = layer_request(w, x, **SLIDING, scale=6**-0.5)
    matches(client, "/multihead", {**body, "expected": {"output": js(right[0])}})
    d = diagnosed(client, "/multihead", {**body, "expected": {"output": js(theirs[0])}}, "output")
    assert d["mistakes"] == ["scale_from_config_ignored", "window_missing"], d


def test_the_right_sliding_window_matches(client: TestClient) -> None:
    """The band given to SDPA as attn_mask, as transformers #30127 does: no mismatch."""
    right = port(X, W, 2, sdpa(attn_mask=band(L6, 2)))
    expected = {"concat": js(right["concat"][0]), "output": js(right["output"][0])}
    matches(client, "/multihead", layer_request(W, **SLIDING, expected=expected))


def test_builder_port_is_the_right_layer_and_the_window_changes_it() -> None:
    """``port`` with the window given is the float64 NumPy layer written out here; without it,
    the numbers differ far beyond any tolerance."""
    x, w = X[0].numpy(), {p: t.numpy() for p, t in W.items()}
    right = port(X, W, 2, sdpa(attn_mask=band(L6, 2)))["output"][0].numpy()
    np.testing.assert_allclose(right, numpy_layer(x, w, 2, band(L6, 2).numpy()), atol=1e-12)
    causal_only = port(X, W, 2, sdpa(is_causal=True))["output"][0].numpy()
    assert np.abs(causal_only - right).max() > 1e-3


def numpy_layer(x: Array, w: dict[str, Array], h: int, allowed: Bool) -> Array:
    """The same layer in NumPy: heads as contiguous column blocks, RoPE (half) at 0 … L − 1,
    masked softmax with −∞, concat W_oᵀ."""
    n = x.shape[0]

    def split(m: Array) -> Array:  # (L, h·d) -> (h, L, d)
        return m.reshape(n, h, -1).transpose(1, 0, 2)

    q, k, v = split(x @ w["q"].T), split(x @ w["k"].T), split(x @ w["v"].T)
    q, k = (rope(torch.tensor(t), torch.arange(n)).numpy() for t in (q, k))
    s = np.where(allowed, q @ k.transpose(0, 2, 1) / np.sqrt(q.shape[-1]), -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    out = (e / e.sum(axis=-1, keepdims=True)) @ v  # (h, L, d)
    return out.transpose(1, 0, 2).reshape(n, -1) @ w["o"].T  # type: ignore[no-any-return]


def test_builder_rope_is_transformers_apply_rotary_pos_emb() -> None:
    """``rope`` is Llama's rotation (``apply_rotary_pos_emb`` with float64 tables)."""
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    x = randn(1, 2, L6, 4, seed=9)
    inv = 1.0 / 10000.0 ** (torch.arange(0, 4, 2, dtype=F64) / 4)
    emb = torch.cat([torch.arange(L6, dtype=F64)[:, None] * inv] * 2, dim=-1)
    theirs, _ = llama.apply_rotary_pos_emb(x, x, emb.cos()[None], emb.sin()[None])
    np.testing.assert_allclose(rope(x, torch.arange(L6)).numpy(), theirs.numpy(), atol=1e-14)


# ---- output_projection_missing ---------------------------------------------------------------


class Head(torch.nn.Module):
    """One head of "Let's build GPT" (karpathy/ng-video-lecture): key, query and value
    ``nn.Linear(n_embd, head_size, bias=False)``, the causal ``tril`` mask filled with −∞, the
    scores scaled by ``scale_by`` ** −½ (head_size in gpt.py; n_embd = C in the lecture's
    notebook, before PR #6)."""

    def __init__(self, n_embd: int, head_size: int, scale_by: int) -> None:
        super().__init__()
        self.key = torch.nn.Linear(n_embd, head_size, bias=False, dtype=F64)
        self.query = torch.nn.Linear(n_embd, head_size, bias=False, dtype=F64)
        self.value = torch.nn.Linear(n_embd, head_size, bias=False, dtype=F64)
        self.scale_by = scale_by

    def forward(self, x: Tensor) -> Tensor:
        t = x.shape[1]
        wei = self.query(x) @ self.key(x).transpose(-2, -1) * self.scale_by**-0.5
        wei = wei.masked_fill(torch.tril(torch.ones(t, t)) == 0, float("-inf"))
        return F.softmax(wei, dim=-1) @ self.value(x)


class MultiHeadAttention(torch.nn.Module):
    """The lecture's ``MultiHeadAttention``: the heads side by side, then ``self.proj`` — or,
    as first written in the lecture (``project=False``), ``torch.cat([h(x) for h in
    self.heads], dim=-1)`` returned as it is."""

    def __init__(self, n_embd: int, num_heads: int, scale_by: int, project: bool) -> None:
        super().__init__()
        size = n_embd // num_heads
        self.heads = torch.nn.ModuleList(Head(n_embd, size, scale_by) for _ in range(num_heads))
        self.proj = torch.nn.Linear(n_embd, n_embd, dtype=F64)
        self.project = project

    def forward(self, x: Tensor) -> Tensor:
        out = torch.cat([h(x) for h in self.heads], dim=-1)
        return self.proj(out) if self.project else out


def lecture(scale_by: int, project: bool) -> tuple[Json, Tensor]:
    """The layer (n_embd 8, 2 heads of 4, its weights seeded) as a causal /multihead request
    with its projection and bias, and its output on X (1, 6, 8)."""
    with torch.random.fork_rng():  # seeded here without touching the session's torch RNG
        torch.manual_seed(8)
        layer = MultiHeadAttention(D8, 2, scale_by, project).eval()
    parts = (("q", "query"), ("k", "key"), ("v", "value"))
    stacked = {p: torch.cat([getattr(h, name).weight for h in layer.heads]) for p, name in parts}
    w = stacked | {"o": layer.proj.weight, "o_bias": layer.proj.bias}
    with torch.no_grad():
        out = layer(X)
    request = layer_request({p: t.detach() for p, t in w.items()}, mask={"type": "causal"})
    del request["rope"]  # the lecture's layer has learned positions before it, no RoPE
    return request, out


def test_the_lectures_heads_returned_without_proj_are_output_projection_missing(
    client: TestClient,
) -> None:
    """ "Let's build GPT" (karpathy/ng-video-lecture): ``MultiHeadAttention.forward`` first
    returns ``torch.cat([h(x) for h in self.heads], dim=-1)``; ``self.proj`` (with its bias)
    comes later in the lecture. The request describes the layer with its projection."""
    request, theirs = lecture(D8 // 2, project=False)
    d = diagnosed(
        client, "/multihead", {**request, "expected": {"output": js(theirs[0])}}, "output"
    )
    assert d["mistakes"] == ["output_projection_missing"], d
    assert "concat W_o + b_o" in d["explanation"] and "o_proj" in d["explanation"], d


def test_the_lectures_notebook_without_proj_and_scaled_by_n_embd_is_a_pair(
    client: TestClient,
) -> None:
    """The lecture's notebook scaled the scores by C^−½ with C = n_embd (fixed by
    karpathy/ng-video-lecture PR #6, "We should scale attention by head size") at the time its
    MultiHeadAttention returned the heads without ``self.proj``: both at once."""
    request, theirs = lecture(D8, project=False)
    d = diagnosed(
        client, "/multihead", {**request, "expected": {"output": js(theirs[0])}}, "output"
    )
    assert d["mistakes"] == ["scale_by_model_dim", "output_projection_missing"], d


def test_the_lectures_layer_with_its_projection_matches(client: TestClient) -> None:
    request, right = lecture(D8 // 2, project=True)
    matches(client, "/multihead", {**request, "expected": {"output": js(right[0])}})


def test_builder_the_lectures_layer_is_the_port_without_rope() -> None:
    """The lecture's layer is ``port`` (no RoPE, SDPA causal) on its own weights; without the
    projection it is ``port``'s concat."""
    request, out = lecture(D8 // 2, project=True)
    _, concat = lecture(D8 // 2, project=False)
    names = {"q": "q_proj.weight", "k": "k_proj.weight", "v": "v_proj.weight"}
    names |= {"o": "o_proj.weight", "o_bias": "o_proj.bias"}
    w = {p: torch.tensor(request[n], dtype=F64) for p, n in names.items()}
    ref = port(X, w, 2, sdpa(is_causal=True), base=None)
    np.testing.assert_allclose(out.numpy(), ref["output"].numpy(), atol=1e-12)
    np.testing.assert_allclose(concat.numpy(), ref["concat"].numpy(), atol=1e-12)
    assert np.abs(concat.numpy() - out.numpy()).max() > 1e-2


# ---- kv_heads_repeated_wrong -----------------------------------------------------------------

# A Llama-style layer with 8 query heads and 2 key/value heads of 4: d_model 16, L = 5
H8, H_KV, L5 = 8, 2, 5
X16 = randn(1, L5, 16, seed=61)
W_GQA = {"q": weights_of(32, 16, 62), "k": weights_of(8, 16, 63), "v": weights_of(8, 16, 64)}
W_GQA["o"] = weights_of(16, 32, 65)


def gqa_request(x: Tensor = X16, **rest: Any) -> Json:
    return {**layer_request(W_GQA, x, **rest), "num_heads": H8, "num_kv_heads": H_KV}


def rope_meta(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    """Meta's reference Llama RoPE (llama/model.py ``apply_rotary_emb``): features (2i, 2i + 1)
    as one complex number times ``polar(1, p·θ_i)``, in float64."""
    d = x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=F64) / d)
    angle = positions.to(F64)[:, None] * inv  # (n, d/2)
    cis = torch.polar(torch.ones_like(angle), angle)
    pairs = torch.view_as_complex(x.contiguous().reshape(*x.shape[:-1], d // 2, 2))
    return torch.view_as_real(pairs * cis).flatten(-2)


def test_a_llama_port_repeating_kv_heads_as_a_tile_is_kv_heads_repeated_wrong(
    client: TestClient,
) -> None:
    """onnx/onnx PR #7274: ONNX's Attention op repeated the grouped key/value heads with Tile
    ([head0, head1, head0, head1]) where torch uses repeat_interleave (apple/axlearn #842 is the
    same confusion); here a Llama port with 8 heads and 2 KV heads writing
    ``k.repeat(1, 4, 1, 1)`` for transformers' ``repeat_kv``."""
    theirs = port(X16, W_GQA, H8, sdpa(is_causal=True), h_kv=H_KV, tile=True)["output"]
    body = gqa_request(mask={"type": "causal"}, expected={"output": js(theirs[0])})
    d = diagnosed(client, "/multihead", body, "output")
    assert d["mistakes"] == ["kv_heads_repeated_wrong"], d
    text = d["explanation"]
    assert "k.repeat(1, 4, 1, 1)" in text and "repeat_interleave(4, dim=1)" in text, text


def port_cache(
    x: Tensor,
    tile: bool = False,
    p: int = 3,
    *,
    is_causal: bool = False,
    from_zero: bool = False,
    strict: bool = False,
) -> dict[str, Any]:
    """``port``'s GQA layer on x (1, n, 16) as a decode step: the cache of its first p tokens
    per key/value head (keys rotated at 0 … p − 1, as transformers' DynamicCache holds them),
    and the output of the n − p new tokens attending to all n keys (lower-right causal: new
    query i sees keys 0 … p + i). The port's mistakes: ``tile`` (``k.repeat``), ``is_causal``
    (SDPA's is_causal=True: upper-left, query i sees keys 0 … i), ``from_zero`` (the new
    tokens rotated at 0 … n − p − 1: position_ids = arange(L), the cache's length ignored),
    ``strict`` (each new query's own key hidden too: j < p + i)."""
    b, n, _ = x.shape

    def heads(t: Tensor, count: int) -> Tensor:
        return t.view(b, n, count, -1).transpose(1, 2)

    at = torch.arange(n)
    if from_zero:
        at = torch.cat([torch.arange(p), torch.arange(n - p)])
    k, v = rope(heads(x @ W_GQA["k"].T, H_KV), at), heads(x @ W_GQA["v"].T, H_KV)
    q = rope(heads(x @ W_GQA["q"].T, H8), at)[:, :, p:]
    kk, vv = grouped(k, H8 // H_KV, tile), grouped(v, H8 // H_KV, tile)
    if is_causal:
        out = F.scaled_dot_product_attention(q, kk, vv, is_causal=True)
    else:
        i, j = torch.arange(n - p)[:, None] + p, torch.arange(n)[None, :]
        allowed = j < i if strict else j <= i
        out = F.scaled_dot_product_attention(q, kk, vv, attn_mask=allowed)
    concat = out.transpose(1, 2).reshape(b, n - p, -1)
    past = {"k": js(k[0, :, :p]), "v": js(v[0, :, :p])}
    return {"past": past, "output": concat @ W_GQA["o"].T}


def test_a_decode_step_with_its_cache_tiled_is_kv_heads_repeated_wrong(client: TestClient) -> None:
    """The same port decoding 2 new tokens after a cache of 3: the cache and the new keys tiled
    alike; the same step with repeat_kv's layout matches."""
    theirs, right = port_cache(X16, tile=True), port_cache(X16, tile=False)
    body = gqa_request(X16[:, 3:], past=theirs["past"])
    wrong = {**body, "expected": {"output": js(theirs["output"][0])}}
    d = diagnosed(client, "/multihead", wrong, "output")
    assert d["mistakes"] == ["kv_heads_repeated_wrong"], d
    matches(client, "/multihead", {**body, "expected": {"output": js(right["output"][0])}})


def test_a_port_of_metas_llama_on_hf_weights_tiling_kv_is_a_pair(client: TestClient) -> None:
    """A port keeping Meta's reference ``apply_rotary_emb`` (interleaved pairs) on Hugging Face
    weights (permuted for ``rotate_half`` by convert_llama_weights_to_hf) and writing
    ``.repeat`` for ``repeat_kv``: rope_style_swapped and kv_heads_repeated_wrong at once."""
    causal = sdpa(is_causal=True)
    theirs = port(X16, W_GQA, H8, causal, h_kv=H_KV, tile=True, rotate=rope_meta)["output"]
    body = gqa_request(mask={"type": "causal"}, expected={"output": js(theirs[0])})
    d = diagnosed(client, "/multihead", body, "output")
    assert d["mistakes"] == ["rope_style_swapped", "kv_heads_repeated_wrong"], d


def test_the_right_grouped_query_layer_matches(client: TestClient) -> None:
    """repeat_kv's layout, here through SDPA's own ``enable_gqa=True``: no mismatch."""
    right = port(X16, W_GQA, H8, sdpa(is_causal=True, enable_gqa=True), h_kv=H_KV)
    body = gqa_request(mask={"type": "causal"}, expected={"output": js(right["output"][0])})
    matches(client, "/multihead", body)


def test_builder_grouped_heads_and_metas_rope() -> None:
    """``grouped`` is ``repeat_interleave`` (and SDPA's enable_gqa), its tile the other order;
    ``rope_meta`` is ``rope`` on the features reordered (pairs (0, 1), (2, 3) become (0, 2),
    (1, 3))."""
    t = randn(1, H_KV, L5, 4, seed=66)
    np.testing.assert_array_equal(grouped(t, 4).numpy(), t.repeat_interleave(4, dim=1).numpy())
    tiled = grouped(t, 4, tile=True)
    for i in range(H8):
        np.testing.assert_array_equal(tiled[0, i].numpy(), t[0, i % H_KV].numpy())
    q = randn(1, H8, L5, 4, seed=67)
    with_gqa = F.scaled_dot_product_attention(q, t, t, is_causal=True, enable_gqa=True)
    by_hand = F.scaled_dot_product_attention(q, grouped(t, 4), grouped(t, 4), is_causal=True)
    np.testing.assert_allclose(with_gqa.numpy(), by_hand.numpy(), atol=1e-14)
    x, at, order = randn(1, 2, L5, 4, seed=68), torch.arange(L5), [0, 2, 1, 3]
    turned = rope_meta(x, at)[..., order].numpy()
    np.testing.assert_allclose(turned, rope(x[..., order], at).numpy(), atol=1e-14)


def test_numpy_heads_tiled_with_np_tile_are_kv_heads_repeated_wrong(client: TestClient) -> None:
    """Q, K, V given per head (no projections) and the grouped heads spread with ``np.tile``,
    as ONNX's NumPy reference Attention did before onnx/onnx PR #7274."""
    rng = np.random.default_rng(69)
    q, k, v = rng.normal(size=(4, 3, 2)), rng.normal(size=(2, 3, 2)), rng.normal(size=(2, 3, 2))
    kt, vt = np.tile(k, (2, 1, 1)), np.tile(v, (2, 1, 1))  # (4, 3, 2): heads 0, 1, 0, 1
    s = q @ kt.transpose(0, 2, 1) / np.sqrt(2)
    w = np.exp(s - s.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    concat = (w @ vt).transpose(1, 0, 2).reshape(3, -1)  # (L, h·d_v), no W_o given
    body = {"q": q.tolist(), "k": k.tolist(), "v": v.tolist(), "num_heads": 4}
    d = diagnosed(client, "/multihead", {**body, "expected": {"output": concat.tolist()}}, "output")
    assert d["mistakes"] == ["kv_heads_repeated_wrong"], d


# ---- mask_not_infinite -----------------------------------------------------------------------

QKV = [randn(2, L6, 4, seed=s) for s in (71, 72, 73)]  # a batch of two, d_k = d_v = 4
LEFT_PADDED = torch.tensor([[True, True, False, False, False, False], [False] * L6])  # torch


def filled(q: Tensor, k: Tensor, allowed: Tensor, fill: float, scale: float = 0.5) -> Tensor:
    """Weights as ``scores.masked_fill(~allowed, fill)`` then ``softmax(dim=-1)`` make them."""
    scores = q @ k.transpose(-2, -1) * scale
    return F.softmax(scores.masked_fill(~allowed, fill), dim=-1)


def causal_mask(n: int) -> Tensor:
    return torch.ones(n, n, dtype=torch.bool).tril()


def batched(q: Tensor, k: Tensor, v: Tensor) -> Json:
    return {"q": js(q), "k": js(k), "v": js(v)}


def test_a_tutorials_masked_fill_with_minus_epsilon_is_mask_not_infinite(
    client: TestClient,
) -> None:
    """hyunwoongko/transformer (issue #10, fixed later): ``ScaleDotProductAttention`` filled the
    masked scores with ``-e``, e = 1e-12 — 0 for the softmax — so every masked key kept
    weight."""
    q, k, v = (t[:1] for t in QKV)
    theirs = filled(q, k, causal_mask(L6), -1e-12)
    body = {**batched(q[0], k[0], v[0]), "mask": {"type": "causal"}}
    d = diagnosed(client, "/mask", {**body, "expected": {"weights": js(theirs[0])}}, "weights")
    assert d["mistakes"] == ["mask_not_infinite"], d
    assert "set to 0 instead of −∞" in d["explanation"], d["explanation"]


def test_transformers_finfo_min_on_a_left_padded_batch_is_mask_not_infinite(
    client: TestClient,
) -> None:
    """transformers fills masked scores with ``torch.finfo(dtype).min`` (its
    AttentionMaskConverter), not −∞: in a left-padded batch under the causal mask the first
    rows of the padded item see no key at all and come out uniform (1/S) where −∞ leaves
    them empty (zeros here)."""
    q, k, v = QKV
    allowed = causal_mask(L6) & ~LEFT_PADDED[:, None, :]  # (2, L, S)
    theirs = filled(q, k, allowed, torch.finfo(torch.float32).min)
    body = {**batched(q, k, v), "mask": {"type": "causal"}, "key_padding_mask": js(LEFT_PADDED)}
    d = diagnosed(client, "/mask", {**body, "expected": {"weights": js(theirs)}}, "weights")
    assert d["mistakes"] == ["mask_not_infinite"], d
    assert "1/S each" in d["explanation"] and "fully_masked_rows" in d["explanation"], d
    # asked for that policy, the same numbers are right
    uniform = {**body, "fully_masked_rows": "uniform", "expected": {"weights": js(theirs)}}
    matches(client, "/mask", uniform)


def test_an_unscaled_lecture_cell_masked_with_tril_is_a_pair(client: TestClient) -> None:
    """ "Let's build GPT"'s first self-attention cell computes ``wei = q @ k.transpose(-2, -1)``
    before its note on scaling, and masks the future there; done with ``torch.tril(wei)`` (as
    rasbt/LLMs-from-scratch #279 applies tril to the attention matrix directly) the masked
    scores are 0: scale_missing and mask_not_infinite."""
    q, k, v = (t[:1] for t in QKV)
    wei = torch.tril(q @ k.transpose(-2, -1))
    theirs = F.softmax(wei, dim=-1) @ v
    body = {**batched(q[0], k[0], v[0]), "mask": {"type": "causal"}}
    d = diagnosed(client, "/mask", {**body, "expected": {"output": js(theirs[0])}}, "output")
    assert d["mistakes"] == ["scale_missing", "mask_not_infinite"], d


def test_minus_infinity_and_a_fill_no_row_notices_match(client: TestClient) -> None:
    """−∞ (``masked_fill(mask == 0, float('-inf'))``) is right; the Annotated Transformer's
    −1e9 gives the same weights wherever a row keeps a key, and its masked scores count as
    masked (at or below −1e9): neither is a mistake."""
    q, k, v = (t[:1] for t in QKV)
    body = {**batched(q[0], k[0], v[0]), "mask": {"type": "causal"}}
    for fill in (float("-inf"), -1e9):
        scores = (q @ k.transpose(-2, -1) * 0.5).masked_fill(~causal_mask(L6), fill)
        weights = F.softmax(scores, dim=-1)
        expected = {"masked_scores": js(scores[0]), "weights": js(weights[0])}
        matches(client, "/mask", {**body, "expected": expected | {"output": js(weights @ v)[0]}})


def test_builder_fills_differ_from_minus_infinity_only_as_said() -> None:
    """A fill of −1e-12 is −∞ nowhere: masked keys keep weight; float32's lowest is −∞ in every
    row that keeps a key, and uniform in a row that keeps none."""
    q, k, _ = QKV
    allowed = causal_mask(L6) & ~LEFT_PADDED[:, None, :]
    right = filled(q, k, allowed, float("-inf")).nan_to_num(0.0)  # empty rows: 0/0 -> 0
    assert (filled(q, k, allowed, -1e-12)[~allowed] > 1e-3).all()
    lowest = filled(q, k, allowed, torch.finfo(torch.float32).min)
    empty = ~allowed.any(dim=-1)  # (2, L): item 0's first two rows
    assert empty.sum() == 2
    np.testing.assert_allclose(lowest[~empty].numpy(), right[~empty].numpy(), atol=1e-15)
    np.testing.assert_allclose(lowest[empty].numpy(), 1 / L6, atol=1e-15)


# ---- causal_alignment_swapped ----------------------------------------------------------------

L3, S5 = 3, 5
Q3, K5, V5 = randn(1, L3, 4, seed=81), randn(1, S5, 4, seed=82), randn(1, S5, 4, seed=83)


def aligned(alignment: str) -> Json:
    return {**direct(Q3, K5, V5), "mask": {"type": "causal", "alignment": alignment}}


def test_sdpa_is_causal_where_lower_right_was_asked_is_causal_alignment_swapped(
    client: TestClient,
) -> None:
    """PyTorch's ``is_causal=True`` aligns the causal mask upper-left when L ≠ S
    (torch.nn.attention.bias documents it; pytorch/pytorch #144858), where FlashAttention since
    2.1 and a decode step align it lower-right: the same call where lower-right was meant."""
    theirs = F.scaled_dot_product_attention(Q3, K5, V5, is_causal=True)
    body = {**aligned("lower_right"), "expected": {"output": js(theirs[0])}}
    d = diagnosed(client, "/mask", body, "output")
    assert d["mistakes"] == ["causal_alignment_swapped"], d
    assert "causal_lower_right" in d["explanation"] and "i + 2" in d["explanation"], d


def test_a_lower_right_mask_where_upper_left_was_asked_is_causal_alignment_swapped(
    client: TestClient,
) -> None:
    """The reverse: ``torch.nn.attention.bias.causal_lower_right`` (FlashAttention's
    ``causal=True`` since 2.1) where the layer means upper-left."""
    from torch.nn.attention.bias import causal_lower_right

    theirs = F.scaled_dot_product_attention(Q3, K5, V5, attn_mask=causal_lower_right(L3, S5))
    body = {**aligned("upper_left"), "expected": {"output": js(theirs[0])}}
    d = diagnosed(client, "/mask", body, "output")
    assert d["mistakes"] == ["causal_alignment_swapped"], d
    assert '"alignment": "lower_right"' in d["explanation"], d["explanation"]


def test_a_decode_step_through_sdpa_is_causal_is_causal_alignment_swapped(
    client: TestClient,
) -> None:
    """karpathy/nanochat PR #456 (and pytorch/pytorch #144858): with a KV cache, SDPA's
    ``is_causal=True`` lets new query i see keys 0 … i only, not the cache before it; here 2
    new tokens after a cache of 3."""
    theirs = port_cache(X16, is_causal=True)
    body = gqa_request(X16[:, 3:], past=theirs["past"])
    wrong = {**body, "expected": {"output": js(theirs["output"][0])}}
    d = diagnosed(client, "/multihead", wrong, "output")
    assert d["mistakes"] == ["causal_alignment_swapped"], d
    assert "cache's 3" in d["explanation"], d["explanation"]


def test_a_decode_step_that_forgets_the_cache_offset_twice_is_a_pair(client: TestClient) -> None:
    """A decode loop that ignores the cache's length everywhere (transformers'
    ``cache_position``): position_ids = arange(L) for the new tokens' RoPE, and SDPA's
    ``is_causal=True`` for the mask: decode_position_offset and causal_alignment_swapped."""
    theirs = port_cache(X16, is_causal=True, from_zero=True)
    body = gqa_request(X16[:, 3:], past=theirs["past"])
    wrong = {**body, "expected": {"output": js(theirs["output"][0])}}
    d = diagnosed(client, "/multihead", wrong, "output")
    assert d["mistakes"] == ["decode_position_offset", "causal_alignment_swapped"], d


def test_each_alignment_computed_as_asked_matches(client: TestClient) -> None:
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left

    for alignment, bias in (("upper_left", causal_upper_left), ("lower_right", causal_lower_right)):
        right = F.scaled_dot_product_attention(Q3, K5, V5, attn_mask=bias(L3, S5))
        matches(client, "/mask", {**aligned(alignment), "expected": {"output": js(right[0])}})


def test_builder_the_two_alignments_differ_and_is_causal_is_upper_left() -> None:
    from torch.nn.attention.bias import causal_lower_right, causal_upper_left

    upper = F.scaled_dot_product_attention(Q3, K5, V5, is_causal=True)
    same = F.scaled_dot_product_attention(Q3, K5, V5, attn_mask=causal_upper_left(L3, S5))
    lower = F.scaled_dot_product_attention(Q3, K5, V5, attn_mask=causal_lower_right(L3, S5))
    np.testing.assert_allclose(upper.numpy(), same.numpy(), atol=1e-15)
    assert np.abs(upper.numpy() - lower.numpy()).max() > 1e-2
    i, j = np.indices((L3, S5))
    assert (causal_lower_right(L3, S5)._materialize().numpy() == (j <= i + S5 - L3)).all()


def test_a_decode_step_hiding_its_own_key_is_causal_diagonal_masked_after_the_cache(
    client: TestClient,
) -> None:
    """The first edition's causal_diagonal_masked in a decode step: the strict mask counted from
    the cache's end (new query i sees keys 0 … 3 + i − 1), as ``triu(ones, 0)`` offset by the
    cache would make it; the diagnosis's causal mask keeps the cache's offset."""
    theirs = port_cache(X16, strict=True)
    body = gqa_request(X16[:, 3:], past=theirs["past"])
    wrong = {**body, "expected": {"output": js(theirs["output"][0])}}
    d = diagnosed(client, "/multihead", wrong, "output")
    assert d["mistakes"] == ["causal_diagonal_masked"], d


# ---- softmax_over_batch ----------------------------------------------------------------------

QB, KB, VB = randn(3, 4, 4, seed=91), randn(3, 4, 4, seed=92), randn(3, 4, 4, seed=93)


def implicit_softmax(scores: Tensor) -> Tensor:
    """``F.softmax(scores)`` without ``dim``, as old code calls it: for a 3-D tensor torch picks
    dim 0 (``_get_softmax_dim``) and warns."""
    with pytest.warns(UserWarning, match="Implicit dimension choice for softmax"):
        return F.softmax(scores)


def test_f_softmax_without_dim_on_batched_scores_is_softmax_over_batch(
    client: TestClient,
) -> None:
    """pytorch/pytorch #5733 and its kin ("Implicit dimension choice for softmax has been
    deprecated"): ``F.softmax(scores)`` of the [B][L][S] scores, no ``dim``, runs over axis 0,
    the batch."""
    weights = implicit_softmax(QB @ KB.transpose(1, 2) / 2.0)
    body = {**batched(QB, KB, VB), "expected": {"weights": js(weights)}}
    d = diagnosed(client, "/attention", body, "weights")
    assert d["mistakes"] == ["softmax_over_batch"], d
    assert "axis 0" in d["explanation"] and "dim=-1" in d["explanation"], d["explanation"]


def test_unscaled_dot_attention_without_dim_is_a_pair(client: TestClient) -> None:
    """Luong-style dot attention (``torch.bmm(q, k.transpose(1, 2))``, no scale) written with
    ``F.softmax`` and no ``dim``, compared with scaled dot-product attention: scale_missing and
    softmax_over_batch."""
    out = implicit_softmax(torch.bmm(QB, KB.transpose(1, 2))) @ VB
    body = {**batched(QB, KB, VB), "expected": {"output": js(out)}}
    d = diagnosed(client, "/attention", body, "output")
    assert d["mistakes"] == ["scale_missing", "softmax_over_batch"], d


def test_the_softmax_over_the_keys_of_a_batch_matches(client: TestClient) -> None:
    weights = F.softmax(QB @ KB.transpose(1, 2) / 2.0, dim=-1)
    expected = {"weights": js(weights), "output": js(weights @ VB)}
    matches(client, "/attention", {**batched(QB, KB, VB), "expected": expected})


def test_builder_implicit_softmax_is_over_the_batch() -> None:
    scores = QB @ KB.transpose(1, 2)
    np.testing.assert_array_equal(implicit_softmax(scores).numpy(), F.softmax(scores, 0).numpy())
    np.testing.assert_allclose(implicit_softmax(scores).sum(0).numpy(), 1.0, atol=1e-15)


# ---- rope_base_wrong for any base: fitted from the numbers ----------------------------------

# A layer with heads wide enough for the base to show: d_model 16, 2 heads of 8, L = 8 tokens
X8 = randn(1, 8, 16, seed=61)
W16 = {p: weights_of(16, 16, 70 + i) for i, p in enumerate("qkvo")}


def test_a_starcoder2_base_in_a_llama_port_is_rope_base_wrong_named_100000(
    client: TestClient,
) -> None:
    """A Llama port run with StarCoder2's rope_theta (100000, its config.json; also
    DeepSeek-Coder's) where the request asks the Llama default of 10000: 100000 is none of the
    common bases listed beforehand, so it is fitted from the numbers and named."""
    theirs = port(X8, W16, 2, sdpa(is_causal=True), base=100_000.0)
    body = layer_request(
        W16, X8, mask={"type": "causal"}, expected={"output": js(theirs["output"][0])}
    )
    d = diagnosed(client, "/multihead", body, "output")
    assert d["mistakes"] == ["rope_base_wrong"], d
    assert "base 100,000 where 10,000 was asked" in d["explanation"], d["explanation"]


def test_command_r_base_where_500000_was_asked_is_named_8000000(client: TestClient) -> None:
    """Cohere's Command-R (rope_theta = 8000000 in its config.json) rotated with where the
    request asks Llama 3's 500000: the weights of a causal head, fitted to 8,000,000."""
    q, k, v = (randn(1, 1, 8, 8, seed=s) for s in (81, 82, 83))
    at = torch.arange(8)
    w = F.softmax(
        (rope(q, at, 8e6) @ rope(k, at, 8e6).transpose(-1, -2) / 8**0.5).masked_fill(
            ~torch.ones(8, 8, dtype=torch.bool).tril(), float("-inf")
        ),
        dim=-1,
    )
    body = direct(q[0], k[0], v[0]) | {
        "rope": {"base": 500_000},
        "mask": {"type": "causal"},
        "expected": {"weights": js(w[0, 0])},
    }
    d = diagnosed(client, "/attention", body, "weights")
    assert d["mistakes"] == ["rope_base_wrong"], d
    assert "base 8,000,000 where 500,000 was asked" in d["explanation"], d["explanation"]


def test_an_unscaled_notebook_with_base_20000_is_a_pair(client: TestClient) -> None:
    """A notebook cell that leaves out the 1/√d_k (as "Attention is all you need" re-derivations
    often do before adding it) and turns Q and K with a base of 20000 (a from-scratch RoPE
    tutorial's constant where the model means 10000): the pair, the base fitted under the
    other mistake."""
    q, k, v = (randn(1, 1, 8, 8, seed=s) for s in (91, 92, 93))
    at = torch.arange(8)
    w = F.softmax(rope(q, at, 20_000.0) @ rope(k, at, 20_000.0).transpose(-1, -2), dim=-1)
    body = direct(q[0], k[0], v[0]) | {"rope": {}, "expected": {"weights": js(w[0, 0])}}
    d = diagnosed(client, "/attention", body, "weights")
    assert d["mistakes"] == ["scale_missing", "rope_base_wrong"], d
    assert "base 20,000 where 10,000 was asked" in d["explanation"], d["explanation"]


def test_a_base_no_one_rounds_is_fitted_to_float64_agreement(client: TestClient) -> None:
    """Any base, not only a round one: a cell whose rope_theta was computed (10000·π, as a
    from-scratch exercise might scale it) where 10000 was asked. The fitted base reproduces
    the numbers to 1e-10 (the request's tolerance) and is named to its decimals."""
    q, k, v = (randn(1, 1, 8, 8, seed=s) for s in (94, 95, 96))
    at, theta = torch.arange(8), 10_000.0 * np.pi
    w = F.softmax(rope(q, at, theta) @ rope(k, at, theta).transpose(-1, -2) / 8**0.5, dim=-1)
    body = direct(q[0], k[0], v[0]) | {"rope": {}, "expected": {"weights": js(w[0, 0])}}
    d = diagnosed(client, "/attention", body, "weights")
    assert d["mistakes"] == ["rope_base_wrong"], d
    assert "base 31,415.9" in d["explanation"], d["explanation"]


def test_the_asked_base_matches(client: TestClient) -> None:
    """The same numbers with the base the request asks: a match, nothing fitted."""
    theirs = port(X8, W16, 2, sdpa(is_causal=True), base=100_000.0)
    body = layer_request(
        W16, X8, mask={"type": "causal"}, expected={"output": js(theirs["output"][0])}
    )
    matches(client, "/multihead", body | {"rope": {"base": 100_000}})


# ---- partial_rotary_wrong ---------------------------------------------------------------------


def rope_partial(x: Tensor, positions: Tensor, base: float = 10000.0, r: int = 0) -> Tensor:
    """Partial RoPE as transformers' GPT-NeoX and Phi layers do it: the first ``r`` features
    (``rotary_ndims``) turned by ``rope`` with frequencies over r, the rest passed through
    (``q_rot, q_pass = q[..., :r], q[..., r:]``)."""
    return torch.cat([rope(x[..., :r], positions, base), x[..., r:]], dim=-1)


def partial_port(r: int) -> dict[str, Tensor]:
    """``port``'s layer (d_k 8) on X8, W16, causal, its RoPE turning the first ``r`` features."""

    def turn(x: Tensor, at: Tensor, b: float) -> Tensor:
        return rope_partial(x, at, b, r)

    return port(X8, W16, 2, sdpa(is_causal=True), rotate=turn)


def test_llamas_rotation_on_a_pythia_head_is_partial_rotary_wrong(client: TestClient) -> None:
    """A port that copies Llama's ``apply_rotary_pos_emb`` (every feature turned) onto a
    GPT-NeoX/Pythia head, whose config's rotary_pct = 0.25 turns only the first quarter (the
    request's rotary_dim 2 of d_k 8): every feature rotated where 2 were meant."""
    theirs = partial_port(8)
    body = layer_request(
        W16, X8, mask={"type": "causal"}, expected={"output": js(theirs["output"][0])}
    )
    body["rope"] = {"rotary_dim": 2}
    d = diagnosed(client, "/multihead", body, "output")
    assert d["mistakes"] == ["partial_rotary_wrong"], d
    assert (
        "every one of the head's 8 features was rotated where only the first 2" in d["explanation"]
    )


def test_a_chatglm_half_rotation_where_the_whole_head_turns_is_partial_rotary_wrong(
    client: TestClient,
) -> None:
    """The reverse: a port keeping ChatGLM's (and Persimmon's) partial_rotary_factor = 0.5,
    turning the first 4 of 8 features, for a Llama head that turns all of them."""
    theirs = partial_port(4)
    body = layer_request(
        W16, X8, mask={"type": "causal"}, expected={"output": js(theirs["output"][0])}
    )
    d = diagnosed(client, "/multihead", body, "output")
    assert d["mistakes"] == ["partial_rotary_wrong"], d
    assert "only the first 4 of the head's 8 features were rotated" in d["explanation"]
    assert "set rope.rotary_dim to 4" in d["explanation"]


def test_an_unscaled_notebook_turning_a_whole_phi_head_is_a_pair(client: TestClient) -> None:
    """A notebook cell that turns every feature of a head meant to turn half of them
    (rotary_dim 4 of 8, Phi-1's partial_rotary_factor 0.5) and never scales the scores."""
    q, k, v = (randn(1, 1, 8, 8, seed=s) for s in (101, 102, 103))
    at = torch.arange(8)
    w = F.softmax(rope(q, at) @ rope(k, at).transpose(-1, -2), dim=-1)
    body = direct(q[0], k[0], v[0]) | {
        "rope": {"rotary_dim": 4},
        "expected": {"weights": js(w[0, 0])},
    }
    d = diagnosed(client, "/attention", body, "weights")
    assert d["mistakes"] == ["scale_missing", "partial_rotary_wrong"], d


def test_the_partial_rotation_asked_matches(client: TestClient) -> None:
    """The first 2 of 8 features turned, as rotary_dim 2 asks: a match."""
    theirs = partial_port(2)
    body = layer_request(
        W16, X8, mask={"type": "causal"}, expected={"output": js(theirs["output"][0])}
    )
    matches(client, "/multihead", body | {"rope": {"rotary_dim": 2}})


def test_builder_rope_partial_is_gpt_neox_partial_rotation() -> None:
    """``rope_partial`` is transformers' GPT-NeoX rotation of its first rotary_ndims features
    (``apply_rotary_pos_emb`` on q[..., :r], float64 tables), the rest untouched."""
    neox = pytest.importorskip("transformers.models.gpt_neox.modeling_gpt_neox")
    x, r = randn(1, 2, L6, 8, seed=7), 4
    inv = 1.0 / 10000.0 ** (torch.arange(0, r, 2, dtype=F64) / r)
    emb = torch.cat([torch.arange(L6, dtype=F64)[:, None] * inv] * 2, dim=-1)
    theirs, _ = neox.apply_rotary_pos_emb(x, x, emb.cos()[None], emb.sin()[None])
    np.testing.assert_allclose(
        rope_partial(x, torch.arange(L6), r=r).numpy(), theirs.numpy(), atol=1e-14
    )


# ---- rope_scaling_missing ---------------------------------------------------------------------

YARN: Json = {"type": "yarn", "factor": 4, "original_max_position": 4}  # Qwen's long context
YARN_HF: Json = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                 "original_max_position_embeddings": 4}  # fmt: skip
LLAMA31: Json = {"type": "llama3", "factor": 8, "original_max_position": 4}
LLAMA31_HF: Json = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 4}  # fmt: skip


def hf_rope(params: Json, d: int, n: int) -> tuple[Tensor, float]:
    """transformers' θ_i and attention factor for the scaling ``params`` (its
    ``ROPE_INIT_FUNCTIONS``, in float64 as harness.hf_reference patches it): a head of ``d``."""
    transformers = pytest.importorskip("transformers")
    rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    from harness.hf_reference import float64_torch_in

    c = transformers.LlamaConfig(
        hidden_size=2 * d, num_attention_heads=2, head_dim=d, max_position_embeddings=4096,
        rope_parameters=params,
    )  # fmt: skip
    with float64_torch_in(rope_utils):
        inv_freq, factor = rope_utils.ROPE_INIT_FUNCTIONS[params["rope_type"]](c, "cpu", n)
    return inv_freq.to(F64), float(factor)


def rope_scaled(x: Tensor, positions: Tensor, inv: Tensor, gain: float) -> Tensor:
    """``rope`` with the frequencies ``inv`` (d/2,) and cos and sin × ``gain``, as
    ``LlamaRotaryEmbedding`` applies a scaling's ``attention_scaling``."""
    d = x.shape[-1]
    angle = positions.to(F64)[:, None] * inv[None, :]  # (n, d/2)
    emb = torch.cat([angle, angle], dim=-1)  # (n, d)
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    return x * emb.cos() * gain + half * emb.sin() * gain


def yarn_head(scaled: bool, scale: bool = True) -> tuple[Json, Tensor]:
    """A head of 8 features over 8 tokens: the request asking YaRN and the weights as a cell
    computes them, with the scaling (``scaled``) or RoPE's default frequencies."""
    q, k, v = (randn(1, 1, 8, 8, seed=s) for s in (111, 112, 113))
    at = torch.arange(8)
    inv, gain = (
        hf_rope(YARN_HF, 8, 8)
        if scaled
        else (1.0 / 10000.0 ** (torch.arange(0, 8, 2, dtype=F64) / 8), 1.0)
    )
    scores = rope_scaled(q, at, inv, gain) @ rope_scaled(k, at, inv, gain).transpose(-1, -2)
    w = F.softmax(scores / (8**0.5 if scale else 1.0), dim=-1)
    return direct(q[0], k[0], v[0]) | {"rope": {"scaling": YARN}}, w[0, 0]


def test_yarn_left_out_of_a_cell_is_rope_scaling_missing(client: TestClient) -> None:
    """A cell that builds RoPE's default table (``1/base^(2i/d)``, cos and sin × 1) for a model
    whose config asks YaRN (Qwen2.5's long-context ``rope_scaling`` {"type": "yarn", "factor":
    4}): the frequencies and YaRN's attention factor both left out."""
    body, w = yarn_head(scaled=False)
    d = diagnosed(client, "/attention", body | {"expected": {"weights": js(w)}}, "weights")
    assert d["mistakes"] == ["rope_scaling_missing"], d
    assert "yarn scaling" in d["explanation"] and "attention factor" in d["explanation"], d


def test_an_unscaled_cell_without_yarn_is_a_pair(client: TestClient) -> None:
    """The same cell also leaving out 1/√d_k."""
    body, w = yarn_head(scaled=False, scale=False)
    d = diagnosed(client, "/attention", body | {"expected": {"weights": js(w)}}, "weights")
    assert d["mistakes"] == ["scale_missing", "rope_scaling_missing"], d


def test_a_llama31_port_with_llama3s_rope_is_rope_scaling_missing(client: TestClient) -> None:
    """A Llama 3 port run on Llama 3.1 weights, its RoPE built without the config's
    rope_scaling {"rope_type": "llama3", "factor": 8} (as llama.cpp's first Llama 3.1 runs
    did, before it read the rope scaling factors): base 500000 alone."""
    theirs = port(X8, W16, 2, sdpa(is_causal=True), base=500_000.0)
    body = layer_request(
        W16, X8, mask={"type": "causal"}, expected={"output": js(theirs["output"][0])}
    )
    body["rope"] = {"base": 500_000, "scaling": LLAMA31}
    d = diagnosed(client, "/multihead", body, "output")
    assert d["mistakes"] == ["rope_scaling_missing"], d
    assert "llama3 scaling" in d["explanation"], d


def test_the_scalings_computed_as_transformers_does_match(client: TestClient) -> None:
    """The cell with transformers' YaRN frequencies and attention factor, and the port with its
    llama3 frequencies: both match."""
    body, w = yarn_head(scaled=True)
    matches(client, "/attention", body | {"expected": {"weights": js(w)}})
    inv, gain = hf_rope(LLAMA31_HF, 8, L6 + 2)

    def llama31(x: Tensor, at: Tensor, base: float) -> Tensor:
        return rope_scaled(x, at, inv, gain)

    theirs = port(X8, W16, 2, sdpa(is_causal=True), rotate=llama31)
    body = layer_request(
        W16, X8, mask={"type": "causal"}, expected={"output": js(theirs["output"][0])}
    )
    matches(client, "/multihead", body | {"rope": {"base": 500_000, "scaling": LLAMA31}})


def test_yarns_attention_factor_left_out_is_rope_scaling_missing(client: TestClient) -> None:
    """YaRN's frequencies applied but cos and sin not multiplied by its attention factor
    (mscale = 0.1·ln(factor) + 1, transformers' ``attention_scaling`` in
    ``LlamaRotaryEmbedding.forward``): a port that builds cos and sin from ``inv_freq`` alone,
    as the default RoPE does, leaves it out."""
    q, k, v = (randn(1, 1, 8, 8, seed=s) for s in (111, 112, 113))
    at = torch.arange(8)
    inv, gain = hf_rope(YARN_HF, 8, 8)
    assert gain > 1.1  # what is left out
    scores = rope_scaled(q, at, inv, 1.0) @ rope_scaled(k, at, inv, 1.0).transpose(-1, -2)
    w = F.softmax(scores / 8**0.5, dim=-1)
    body = direct(q[0], k[0], v[0]) | {
        "rope": {"scaling": YARN},
        "expected": {"weights": js(w[0, 0])},
    }
    d = diagnosed(client, "/attention", body, "weights")
    assert d["mistakes"] == ["rope_scaling_missing"], d
    assert f"left out its attention factor {gain:.6g} on cos and sin" in d["explanation"], d


# ---- pairs within a family, a causal mask inverted, YaRN's factor twice ------------------------


def vit_layer(x: Tensor, w: dict[str, Tensor], h: int, after: bool) -> Tensor:
    """The ViT tutorial's ``MultiHeadAttention`` (FrancescoSaverioZuppichini/ViT): q, k, v as
    ``rearrange(self.queries(x), "b n (h d) -> b h n d")``, ``energy = einsum("bhqd, bhkd ->
    bhqk")``, ``att = F.softmax(energy, dim=-1) / emb_size ** (1/2)`` (``after``), or the
    scores divided by √d of one head before the softmax, as meant; then the heads side by side
    and ``self.projection``. (B, L, emb) -> (B, L, emb)."""
    b, n, emb = x.shape

    def heads(t: Tensor) -> Tensor:  # "b n (h d) -> b h n d"
        return t.view(b, n, h, -1).transpose(1, 2)

    q, k, v = (heads(F.linear(x, w[p])) for p in "qkv")
    energy = torch.einsum("bhqd, bhkd -> bhqk", q, k)
    if after:
        att = F.softmax(energy, dim=-1) / emb ** (1 / 2)
    else:
        att = F.softmax(energy / q.shape[-1] ** (1 / 2), dim=-1)
    out = torch.einsum("bhal, bhlv -> bhav", att, v)  # (B, h, L, d)
    return F.linear(out.transpose(1, 2).reshape(b, n, emb), w["o"], w.get("o_bias"))


def vit_request(theirs: Tensor) -> Json:
    body = layer_request(W, expected={"output": js(theirs[0])})
    del body["rope"]  # ViT's patches carry learned positions, no RoPE
    return body


def test_the_vit_tutorials_softmax_over_sqrt_emb_size_is_a_pair(client: TestClient) -> None:
    """FrancescoSaverioZuppichini/ViT#2, #6: ``F.softmax(energy, dim=-1) / emb_size ** (1/2)``
    scales after the softmax, and by √emb_size (d_model 8) where √d of one head (√4) was
    meant: two mistakes of the scale family in one line, named together (API.md, "pairs within
    a family") and told in one sentence."""
    d = diagnosed(client, "/multihead", vit_request(vit_layer(X, W, 2, after=True)), "output")
    assert d["mistakes"] == ["scale_after_softmax", "scale_by_model_dim"], d
    text = d["explanation"]
    assert "divided by √d_model = √8 = 2.828 after the softmax" in text, d
    assert "F.softmax(energy) / emb_size ** (1/2)" in text and "√d_k = 2" in text, d


def test_the_vit_layer_scaled_before_the_softmax_matches(client: TestClient) -> None:
    matches(client, "/multihead", vit_request(vit_layer(X, W, 2, after=False)))


def test_builder_vit_layer_is_the_port_without_rope() -> None:
    """The tutorial's layer scaled as meant is ``port``'s (SDPA's 1/√d) without RoPE."""
    right = port(X, W, 2, sdpa(), base=None)["output"]
    np.testing.assert_allclose(vit_layer(X, W, 2, after=False), right, atol=1e-14)


def triu_port() -> dict[str, Tensor]:
    """rasbt/LLMs-from-scratch#1061: a port hands SDPA ``torch.triu(ones(L, L), 1).bool()``,
    the keys a causal mask hides (``masked_fill``'s convention), where SDPA's boolean
    ``attn_mask`` is true where a query may attend: each query sees only the later keys, the
    last none (torch's math path gives that row's output as it does)."""
    hidden = torch.triu(torch.ones(L6, L6), 1).bool()
    return port(X, W, 2, sdpa(attn_mask=hidden))


def test_sdpa_handed_triu_for_a_causal_mask_is_mask_inverted(client: TestClient) -> None:
    body = layer_request(
        W, mask={"type": "causal"}, expected={"output": js(triu_port()["output"][0])}
    )
    d = diagnosed(client, "/multihead", body, "output")
    assert d["mistakes"] == ["mask_inverted"], d
    text = d["explanation"]
    assert "causal mask was applied inverted" in text and "torch.triu(ones(L, S), 1)" in text, d
    assert "True means attend" in text, d


def test_builder_triu_is_the_causal_mask_inverted() -> None:
    """SDPA given ``~triu(…, 1)`` (that is tril) is the causal layer (is_causal=True); given
    triu(…, 1) it differs."""
    hidden = torch.triu(torch.ones(L6, L6), 1).bool()
    right = port(X, W, 2, sdpa(is_causal=True))["output"]
    np.testing.assert_allclose(port(X, W, 2, sdpa(attn_mask=~hidden))["output"], right, atol=1e-14)
    assert (triu_port()["output"] - right).abs().max() > 0.1


def yarn_twice() -> tuple[Json, float]:
    """YaRN's frequencies with its attention factor g on cos and sin twice (× g²), as a port
    that multiplies cos and sin by mscale where the table it reads (transformers'
    ``LlamaRotaryEmbedding``, × attention_scaling) already carries it: the request asking YaRN,
    the weights as computed, and g."""
    q, k, v = (randn(1, 1, 8, 8, seed=s) for s in (121, 122, 123))
    at = torch.arange(8)
    inv, gain = hf_rope(YARN_HF, 8, 8)
    once_q, once_k = rope_scaled(q, at, inv, gain), rope_scaled(k, at, inv, gain)
    scores = (once_q * gain) @ (once_k * gain).transpose(-1, -2)  # the factor again
    w = F.softmax(scores / 8**0.5, dim=-1)
    body = direct(q[0], k[0], v[0]) | {"rope": {"scaling": YARN}}
    return body | {"expected": {"weights": js(w[0, 0])}}, gain


def test_yarns_attention_factor_applied_twice_is_rope_scaling_missing(client: TestClient) -> None:
    body, gain = yarn_twice()
    assert gain > 1.1  # what is applied twice
    d = diagnosed(client, "/attention", body, "weights")
    assert d["mistakes"] == ["rope_scaling_missing"], d
    assert f"YaRN's attention factor {gain:.6g} was applied twice" in d["explanation"], d
    assert f"× {gain**2:.6g} in all" in d["explanation"], d
