"""The backward's mistakes on DeepSeek's multi-head latent attention (API.md, "The backward
pass, every step": "Compare works on gradients"; docs/api.md 2.7 "Gradients"), at the engine's
level: a learner's MLA backward written here in NumPy the way one writes it by hand, through
DeepSeek's shapes (q_a_proj → q_a_layernorm → q_b_proj, kv_a_proj_with_mqa → kv_a_layernorm →
kv_b_proj, one rotated k_pe per token shared by every head, [nope | rope] queries and keys),
with each mistake the contract lists put in (``dS = P * dP``, ``D = dP.sum(-1)``, the scale
left out, ``P @ dO`` for ``P.T @ dO``, RoPE's backward turning forward on the rope features,
the shared key's gradient taken from one head), is explained by the mistake (or the pair) whose
recomputation through the core's own backward reproduces it; a right gradient is never given a
mistake, and one that no listed mistake reproduces is left without a diagnosis. The service's
functions make only the service's side (the forward and its exact gradients, as the comparison
holds them); every learner's array is this module's NumPy."""

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pytest

from service.core import masks
from service.core.diagnosis import gradients
from service.core.diagnosis.mistakes import applicable, ways
from service.core.diagnosis.search import Search, Target, Tolerance, search, trials
from service.core.diagnosis.stages import Setup, State, Trial
from service.core.latent import (
    LatentDims,
    LatentLayer,
    LatentTrace,
    LatentWeights,
    latent_attention,
    latent_backward,
)
from service.core.positions import Rope
from service.core.variants import Variants
from service.trace.comparison import state_of
from tests.core.test_backward_mistakes import Bugs

Array = np.ndarray[Any, np.dtype[np.float64]]
TIGHT = Tolerance(atol=1e-9, rtol=0.0)
BASE = 10_000.0
EPS = 1e-6


# ---- the learner's side: MLA and its backward by hand, in NumPy ------------------------------


@dataclass(frozen=True)
class Layer:
    """An MLA layer as the learner holds it: weights in in_out (``x @ W``), DeepSeek's sizes."""

    x: Array  # (B, L, d_model)
    w_q: Array  # (q_lora_rank or d_model, h·(nope + r))
    w_kv_a: Array  # (d_model, rank + r)
    kv_norm: Array  # (rank,)
    w_kv_b: Array  # (rank, h·(nope + d_v))
    w_o: Array  # (h·d_v, d_model)
    h: int
    nope: int
    rope: int
    d_v: int
    interleave: bool = False
    w_q_a: Array | None = None  # (d_model, q_lora_rank)
    q_norm: Array | None = None
    b_q_a: Array | None = None
    b_kv_a: Array | None = None
    b_o: Array | None = None

    @property
    def rank(self) -> int:
        return int(self.kv_norm.shape[0])

    @property
    def scale(self) -> float:
        return 1 / float(np.sqrt(self.nope + self.rope))


# what the learner got wrong: tests/core/test_backward_mistakes.py's Bugs; on an MLA layer
# ``member`` is the head whose share of the one rotated key's gradient stands for the heads' sum,
# and ``rope_forward`` turns the rope features' gradients as the forward turns them
NO_BUGS = Bugs()


def _rotate_half(x: Array) -> Array:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _tables(n: int, r: int) -> tuple[Array, Array]:
    """cos, sin (n, r) at positions 0 … n − 1, each frequency twice (Su et al. 2021)."""
    inv = 1.0 / BASE ** (np.arange(0, r, 2) / r)
    angles = np.arange(n)[:, None] * inv[None]
    return np.concatenate([np.cos(angles)] * 2, -1), np.concatenate([np.sin(angles)] * 2, -1)


def _turn(x: Array, interleave: bool) -> Array:
    """transformers' apply_rotary_pos_emb (or _interleave: the pairs' first members, then their
    second members, then the half rotation) on x (..., n, r)."""
    if interleave:
        x = np.concatenate([x[..., 0::2], x[..., 1::2]], axis=-1)
    cos, sin = _tables(x.shape[-2], x.shape[-1])
    return x * cos + _rotate_half(x) * sin


def _turn_back(g: Array, interleave: bool) -> Array:
    """The transpose of :func:`_turn`: −θ (g cos − rotate_half(g) sin), the layout undone."""
    cos, sin = _tables(g.shape[-2], g.shape[-1])
    out = g * cos - _rotate_half(g) * sin
    if interleave:
        half = out.shape[-1] // 2
        laid = np.empty_like(out)
        laid[..., 0::2], laid[..., 1::2] = out[..., :half], out[..., half:]
        out = laid
    return out


def _rms(x: Array, w: Array) -> Array:
    out: Array = x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w
    return out


def _rms_back(x: Array, w: Array, dy: Array) -> tuple[Array, Array]:
    """dx, dw of y = w ∘ x / rms(x): (w∘dy − x̂ mean(w∘dy ∘ x̂)) / rms, Σ dy ∘ x̂."""
    r = np.sqrt((x * x).mean(-1, keepdims=True) + EPS)
    xh, g = x / r, dy * w
    return (g - xh * (g * xh).mean(-1, keepdims=True)) / r, (dy * xh).reshape(-1, x.shape[-1]).sum(
        0
    )


def _heads(a: Array, h: int) -> Array:  # (B, L, h·d) → (B, h, L, d)
    b, n, _ = a.shape
    return a.reshape(b, n, h, -1).transpose(0, 2, 1, 3)


def _merged(a: Array) -> Array:  # (B, h, L, d) → (B, L, h·d)
    b, h, n, d = a.shape
    return a.transpose(0, 2, 1, 3).reshape(b, n, h * d)


def _w(x: Array, d: Array) -> Array:  # a weight's gradient, x @ W: Σ over tokens of xᵀ d
    out: Array = np.einsum("bli,blo->io", x, d)
    return out


def by_hand(m: Layer, d_y: Array, bugs: Bugs = NO_BUGS) -> dict[str, Array]:
    """The learner's forward and backward of a causal MLA layer (DeepseekV3Attention's), with
    ``bugs``: every gradient under the service's name."""
    x, h, nope = m.x, m.h, m.nope
    zero = np.zeros
    if m.w_q_a is not None:
        assert m.q_norm is not None
        a = x @ m.w_q_a + (zero(m.w_q_a.shape[1]) if m.b_q_a is None else m.b_q_a)
        src = _rms(a, m.q_norm)
    else:
        src = x
    q = _heads(src @ m.w_q, h)  # (B, h, L, nope + r)
    comp = x @ m.w_kv_a + (zero(m.w_kv_a.shape[1]) if m.b_kv_a is None else m.b_kv_a)
    latent, k_pe = comp[..., : m.rank], comp[..., m.rank :]
    c_kv = _rms(latent, m.kv_norm)
    kv = _heads(c_kv @ m.w_kv_b, h)
    k_nope, v = kv[..., :nope], kv[..., nope:]
    k_rope = _turn(k_pe, m.interleave)  # (B, L, r): one for every head
    big_q = np.concatenate([q[..., :nope], _turn(q[..., nope:], m.interleave)], -1)
    big_k = np.concatenate(
        [k_nope, np.broadcast_to(k_rope[:, None], (*k_nope.shape[:3], m.rope))], -1
    )
    n = x.shape[1]
    allowed = np.tril(np.ones((n, n), dtype=bool))
    s = np.where(allowed, big_q @ big_k.swapaxes(-1, -2) * m.scale, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    concat = _merged(p @ v)
    # the backward, by hand
    d_o = _heads(d_y @ m.w_o.T, h)  # (B, h, L, d_v)
    d_p = d_o @ v.swapaxes(-1, -2)
    d_v = p @ d_o if bugs.transposed in ("dv", "both") else p.swapaxes(-1, -2) @ d_o
    if bugs.diagonal:
        row = np.zeros(p.shape[:-1])
    elif bugs.unweighted == "allowed":
        row = (d_p * allowed).sum(-1)
    elif bugs.unweighted == "every":
        row = d_p.sum(-1)
    else:
        row = (p * d_p).sum(-1)
    d_s = p * (d_p - row[..., None])
    d_z = d_s if bugs.scale_missing else d_s * m.scale
    d_big_q = d_z @ big_k
    d_big_k = d_z @ big_q if bugs.transposed in ("dk", "both") else d_z.swapaxes(-1, -2) @ big_q

    def back(g: Array) -> Array:  # RoPE's backward as the learner wrote it
        return _turn(g, m.interleave) if bugs.rope_forward else _turn_back(g, m.interleave)

    d_q = np.concatenate([d_big_q[..., :nope], back(d_big_q[..., nope:])], -1)
    shares = d_big_k[..., nope:]  # (B, h, L, r): each head's share of the one k_rope
    d_k_rope = shares.sum(1) if bugs.member is None else shares[:, bugs.member]
    d_kv = _merged(np.concatenate([d_big_k[..., :nope], d_v], -1))
    d_c_kv = d_kv @ m.w_kv_b.T
    d_latent, d_kv_norm = _rms_back(latent, m.kv_norm, d_c_kv)
    d_comp = np.concatenate([d_latent, back(d_k_rope)], -1)
    d_q_m = _merged(d_q)
    out = {
        "grad_weights": d_p, "grad_q_rotated": d_big_q, "grad_k_rotated": d_big_k,
        "grad_v": d_v, "grad_q": d_q, "grad_k_rope": d_k_rope, "grad_c_kv": d_c_kv,
        "grad_w_kv_b": _w(c_kv, d_kv), "grad_kv_a_norm_weight": d_kv_norm,
        "grad_w_kv_a": _w(x, d_comp), "grad_w_q": _w(src, d_q_m), "grad_w_o": _w(concat, d_y),
    }  # fmt: skip
    if m.b_kv_a is not None:
        out["grad_b_kv_a"] = d_comp.reshape(-1, d_comp.shape[-1]).sum(0)
    d_x = d_comp @ m.w_kv_a.T
    d_src = d_q_m @ m.w_q.T
    if m.w_q_a is None:
        return out | {"grad_x": d_x + d_src}
    assert m.q_norm is not None
    d_a, d_q_norm = _rms_back(a, m.q_norm, d_src)
    out |= {"grad_c_q": d_src, "grad_q_a_norm_weight": d_q_norm, "grad_w_q_a": _w(x, d_a)}
    if m.b_q_a is not None:
        out["grad_b_q_a"] = d_a.reshape(-1, d_a.shape[-1]).sum(0)
    return out | {"grad_x": d_x + d_a @ m.w_q_a.T}


# ---- the service's side, as the comparison holds it --------------------------------------------


@dataclass
class Case:
    layer: Layer
    d_y: Array
    base: State  # every forward array and exact gradient, engine shapes
    setup: Setup


def layer(
    rng: np.random.Generator, *, q_lora: bool = True, interleave: bool = False, b: int = 1,
    h: int = 3, bias: bool = True,
) -> Layer:  # fmt: skip
    d_model, n, rank, q_rank, nope, r, d_v = 10, 5, 6, 4, 4, 4, 3

    def w(i: int, o: int) -> Array:
        out: Array = rng.normal(size=(i, o)) / np.sqrt(i)
        return out

    return Layer(
        x=rng.normal(size=(b, n, d_model)),
        w_q=w(q_rank if q_lora else d_model, h * (nope + r)),
        w_kv_a=w(d_model, rank + r), kv_norm=1 + 0.3 * rng.normal(size=rank),
        w_kv_b=w(rank, h * (nope + d_v)), w_o=w(h * d_v, d_model), h=h, nope=nope, rope=r,
        d_v=d_v, interleave=interleave,
        w_q_a=w(d_model, q_rank) if q_lora else None,
        q_norm=1 + 0.3 * rng.normal(size=q_rank) if q_lora else None,
        b_q_a=0.5 * rng.normal(size=q_rank) if q_lora and bias else None,
        b_kv_a=0.5 * rng.normal(size=rank + r) if bias else None,
        b_o=0.5 * rng.normal(size=d_model) if bias else None,
    )  # fmt: skip


def case_of(m: Layer, rng: np.random.Generator) -> Case:
    """The service's forward and backward of the learner's layer, and the diagnosis's setup,
    as /multihead with ``mla`` builds them (service.trace.compute)."""
    b, n, _ = m.x.shape
    weights = LatentWeights(
        w_q=m.w_q, w_kv_a=m.w_kv_a, kv_norm=m.kv_norm, w_kv_b=m.w_kv_b, w_q_a=m.w_q_a,
        q_norm=m.q_norm, b_q_a=m.b_q_a, b_kv_a=m.b_kv_a, w_o=m.w_o, b_o=m.b_o, eps=EPS,
    )  # fmt: skip
    dims = LatentDims(None if m.w_q_a is None else m.w_q_a.shape[1], m.rank, m.nope, m.rope, m.d_v)
    rope = Rope(BASE, "interleaved" if m.interleave else "half")
    specs = (masks.Causal(),)
    combined = masks.combine(list(specs), b, n, n, 0)
    variants = Variants(rope=rope)
    trace: LatentTrace = latent_attention(
        m.x, weights, dims, num_heads=m.h, settings=rope, mask=combined, variants=variants
    )
    d_y = rng.normal(size=trace.block.output.shape)
    grads = latent_backward(
        m.x, weights, dims, trace, d_y, settings=rope, mask=combined, variants=variants
    )
    block = trace.block
    base: State = dict(block.heads.made) | dict(block.block)
    base |= {"average_weights": block.average_weights, "block_output": block.output}
    base |= {"c_kv": trace.c_kv, "k_rope": trace.k_rope}
    base |= grads | {"grad_block_output": d_y}
    base = state_of(base, combined)  # the combined mask's arrays, as the comparison keeps them
    setup = Setup(
        scale=block.heads.scale, d_k=m.nope + m.rope, fully_masked_policy="zero",
        variants=variants, mask_specs=specs, batch=b, seq_len=n, ctx_len=n, num_heads=m.h,
        num_kv_heads=m.h, x_in=block.x_in, w_o=m.w_o, b_o=m.b_o,
        latent=LatentLayer(m.x, weights, dims, trace.c_q, trace.c_kv),
    )  # fmt: skip
    return Case(m, d_y, base, setup)


def diagnosed(case: Case, yours: dict[str, Array], order: tuple[str, ...]) -> tuple[str, Search]:
    """The first of ``order`` where the learner's array differs from the service's, and its
    diagnosis: the earlier ones (they matched) put in place, as the comparison does."""
    base: State = dict(case.base)
    given: dict[str, tuple[int, ...] | None] = {}
    for name in order:
        mine = yours[name]
        assert mine.shape == base[name].shape, name
        if not np.allclose(mine, base[name], rtol=0, atol=1e-9):
            return name, search(base, given, case.setup, Target(name, None, mine), TIGHT)
        base[name], given[name] = mine, None
    raise AssertionError("every array matched")


def codes(found: Search) -> tuple[str, ...]:
    assert found.found is not None, "nothing reproduces the learner's numbers"
    return found.found.mistakes


def a_case(seed: int = 0, **kw: Any) -> Case:
    rng = np.random.default_rng(seed)
    return case_of(layer(rng, **kw), rng)


# ---- the learner's right backward, and the diagnosis's own --------------------------------------

KINDS: dict[str, dict[str, Any]] = {
    "q_lora-half": {"q_lora": True, "interleave": False},
    "q_proj-interleave-batch": {"q_lora": False, "interleave": True, "b": 2, "bias": False},
    "q_lora-interleave": {"q_lora": True, "interleave": True},
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_learners_right_backward_is_the_services(kind: str) -> None:
    case = a_case(1, **KINDS[kind])
    mine = by_hand(case.layer, case.d_y)
    for name, a in mine.items():
        assert np.allclose(a, case.base[name], rtol=0, atol=1e-10), name


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_diagnosiss_backward_without_a_mistake_is_latent_backwards_bit_for_bit(
    kind: str,
) -> None:
    """One backward, not a second copy: the diagnosis's run with no mistake makes every
    gradient of the latents exactly as the answer's latent_backward made it."""
    case = a_case(2, **KINDS[kind])
    made = gradients.gradients(
        case.base, case.setup, gradients.own_rows(case.setup), lambda n, g: g
    )
    names = [n for n in case.base if n.startswith("grad_") and n != "grad_block_output"]
    assert {"grad_x", "grad_c_kv", "grad_k_rope", "grad_w_kv_a", "grad_q"} <= set(names)
    for name in names:
        assert np.array_equal(made[name], case.base[name]), name


# ---- which mistakes are tried, and what each reaches ---------------------------------------------


def test_every_backward_mistake_is_tried_on_mla_and_the_shared_keys_only_with_two_heads() -> None:
    case = a_case()
    assert applicable(case.setup, frozenset(case.base), backward=True) == gradients.CODES
    assert ways(case.setup)[gradients.NOT_SUMMED] == (0.0, 1.0, 2.0)  # each of the h heads
    one = replace(case.setup, num_heads=1, num_kv_heads=1)
    assert gradients.NOT_SUMMED not in applicable(one, frozenset(case.base), backward=True)


@pytest.mark.parametrize(
    ("code", "reached", "not_reached"),
    [
        (gradients.ROPE_FORWARD, ("grad_q", "grad_c_q", "grad_w_kv_a", "grad_x"),
         ("grad_weights", "grad_q_rotated", "grad_v", "grad_k_rope", "grad_c_kv", "grad_w_kv_b")),
        (gradients.NOT_SUMMED, ("grad_k_rope", "grad_w_kv_a", "grad_x"),
         ("grad_weights", "grad_q", "grad_c_kv", "grad_c_q", "grad_w_q")),
        (gradients.DIAGONAL, ("grad_q_rotated", "grad_c_kv", "grad_k_rope", "grad_x"),
         ("grad_weights",)),
    ],
)  # fmt: skip
def test_a_mistake_is_recomputed_only_where_it_reaches(
    code: str, reached: tuple[str, ...], not_reached: tuple[str, ...]
) -> None:
    way = ((code, 0.0),) if code == gradients.NOT_SUMMED else ()
    trial = Trial(frozenset({code}), "zero", way)
    for name in reached:
        assert gradients.reaches(trial, name, mla=True), name
    for name in not_reached:
        assert not gradients.reaches(trial, name, mla=True), name


# ---- each mistake, alone and in pairs --------------------------------------------------------

ALONE = [
    (Bugs(diagonal=True), ["softmax_grad_diagonal"], "grad_q_rotated"),
    (Bugs(unweighted="allowed"), ["softmax_grad_row_term_unweighted"], "grad_q_rotated"),
    (Bugs(unweighted="every"), ["softmax_grad_row_term_unweighted"], "grad_q_rotated"),
    (Bugs(scale_missing=True), ["grad_scale_missing"], "grad_q_rotated"),
    (Bugs(transposed="dv"), ["grad_transposed"], "grad_v"),
    (Bugs(transposed="dk"), ["grad_transposed"], "grad_k_rotated"),
    (Bugs(rope_forward=True), ["rope_grad_not_inverted"], "grad_q"),
    (Bugs(member=2), ["kv_grad_not_summed"], "grad_k_rope"),
]
# the order a learner checks them: the heads' (dP, dQ, dK, dV), the latents', the weights', dx
ORDER = (
    "grad_weights", "grad_q_rotated", "grad_k_rotated", "grad_v", "grad_q", "grad_k_rope",
    "grad_c_kv", "grad_c_q", "grad_w_kv_b", "grad_w_kv_a", "grad_w_q", "grad_x",
)  # fmt: skip


@pytest.mark.parametrize(("bugs", "named", "first"), ALONE)
def test_each_mistake_alone_is_named_at_the_first_gradient_it_changes(
    bugs: Bugs, named: list[str], first: str
) -> None:
    case = a_case(3, interleave=True)
    name, found = diagnosed(case, by_hand(case.layer, case.d_y, bugs), ORDER)
    assert name == first
    assert list(codes(found)) == named


@pytest.mark.parametrize(("bugs", "named", "first"), ALONE)
@pytest.mark.parametrize("kind", list(KINDS))
def test_each_mistake_alone_is_named_from_grad_x_alone(
    kind: str, bugs: Bugs, named: list[str], first: str
) -> None:
    case = a_case(4, **KINDS[kind])
    _, found = diagnosed(case, by_hand(case.layer, case.d_y, bugs), ("grad_x",))
    assert list(codes(found)) == named
    if gradients.NOT_SUMMED in named:
        assert found.found is not None and dict(found.found.ways)[gradients.NOT_SUMMED] == 2


PAIRS = [
    (Bugs(scale_missing=True, rope_forward=True), ["grad_scale_missing", "rope_grad_not_inverted"]),
    (Bugs(diagonal=True, member=1), ["softmax_grad_diagonal", "kv_grad_not_summed"]),
    (Bugs(rope_forward=True, member=0), ["rope_grad_not_inverted", "kv_grad_not_summed"]),
    (Bugs(transposed="dk", rope_forward=True), ["grad_transposed", "rope_grad_not_inverted"]),
    (Bugs(unweighted="every", scale_missing=True),
     ["softmax_grad_row_term_unweighted", "grad_scale_missing"]),
]  # fmt: skip


@pytest.mark.parametrize(("bugs", "named"), PAIRS)
@pytest.mark.parametrize("target", ["grad_x", "grad_w_kv_a"])
def test_each_pair_is_named_from_a_gradient_both_reach(
    target: str, bugs: Bugs, named: list[str]
) -> None:
    case = a_case(5, interleave=True)
    _, found = diagnosed(case, by_hand(case.layer, case.d_y, bugs), (target,))
    assert list(codes(found)) == named


def test_a_gradient_no_listed_mistake_makes_gets_no_diagnosis() -> None:
    case = a_case(6)
    mine = by_hand(case.layer, case.d_y)
    for name in ("grad_x", "grad_c_kv", "grad_k_rope"):
        wrong = mine | {name: mine[name] * 1.5}
        _, found = diagnosed(case, wrong, (name,))
        assert found.found is None and found.complete, name


def test_every_mistake_changes_grad_x_so_a_right_one_is_never_explained() -> None:
    """Each mistake's recomputation of grad_x (each of its ways) differs from the right one:
    a right grad_x is never reproduced by a mistake."""
    case = a_case(7)
    right = case.base["grad_x"]
    for trial in trials(gradients.CODES, "zero", ways(case.setup)):
        if len(trial.mistakes) > 1:
            break
        made = list(gradients.gradient_recomputations(case.base, {}, case.setup, [trial], "grad_x"))
        assert len(made) == 1, trial
        assert not np.allclose(made[0][1], right, rtol=0, atol=1e-6), trial
