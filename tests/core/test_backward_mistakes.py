"""The backward's mistakes (API.md, "Compare works on gradients") at the engine's level: a
learner's wrong gradients, written here in torch the way learners write an attention backward
by hand (``dS = P * dP``, ``D = dP.sum(-1)``, ``dQ = dS @ K`` without the scale, ``P @ dO``
for ``P.T @ dO``, RoPE's backward rotating forward, one query head's ``dK`` for the group's
sum), are explained by the mistake (or the pair) whose recomputation reproduces them; a right
gradient is never given a mistake, and one that no listed mistake reproduces is left without
a diagnosis. The service's own functions make only the service's side (the forward and its
exact gradients, as the comparison holds them); every learner's array is torch's.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np
import pytest

from service.core import masks
from service.core.attention import scaled_dot_product_attention
from service.core.backward import attention_backward, multihead_backward
from service.core.diagnosis import gradients
from service.core.diagnosis.mistakes import EXCLUSIVE, FLOAT32, Seen, applicable, explain, ways
from service.core.diagnosis.search import Search, Target, Tolerance, search, trials
from service.core.diagnosis.stages import Setup, State, Trial
from service.core.multihead import MultiheadWeights, multihead_attention
from service.core.positions import Rope
from service.core.variants import Variants
from service.trace.comparison import state_of

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch
T = Any  # a torch tensor
Array = np.ndarray[Any, np.dtype[np.float64]]
TIGHT = Tolerance(atol=1e-9, rtol=0.0)
BASE = 10_000.0


# ---- the learner's side: attention and its backward by hand, in torch ----------------------


def _rotate_half(x: T) -> T:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def _tables(n: int, d: int) -> tuple[T, T]:
    """cos, sin (n, d) of RoPE's "half" style at positions 0 … n − 1 (Su et al. 2021)."""
    inv = 1.0 / BASE ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(n, dtype=torch.float64)[:, None] * inv[None]
    return torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)


@dataclass(frozen=True)
class Bugs:
    """What the learner got wrong (each field one of the contract's mistakes)."""

    diagonal: bool = False  # dS = P * dP
    unweighted: str | None = None  # D = (dP * mask).sum(-1) ("allowed") or dP.sum(-1) ("every")
    scale_missing: bool = False  # dQ = dS @ K, dK = dS.T @ Q
    transposed: str | None = None  # "dv": dV = P @ dO; "dk": dK = dS @ Q; "both"
    rope_forward: bool = False  # dQ = dQ_r cos + rotate_half(dQ_r) sin: the forward's turn
    member: int | None = None  # dK_j, dV_j = the query head j·g + member's, not the group's sum


@dataclass
class Head:
    """The learner's inputs as torch tensors: (B, [h,] L, d) queries, (B, [h_kv,] S, d) keys
    and values, dO of the output, the mask (True = attend), RoPE's or not, the group size."""

    q: Array
    k: Array
    v: Array
    d_o: Array
    scale: float
    allowed: np.ndarray[Any, np.dtype[np.bool_]] | None = None
    rope: bool = False
    group: int = 1
    extra: dict[str, Array] = field(default_factory=dict)


def by_hand(h: Head, bugs: Bugs = Bugs(), dtype: Any = torch.float64) -> dict[str, Array]:
    """Attention forward, then its backward written out by hand (CS231n-style), with the
    learner's bugs: every gradient under the service's names."""

    def t(a: Array) -> T:
        return torch.tensor(a, dtype=dtype)

    q, k, v, d_o = t(h.q), t(h.k), t(h.v), t(h.d_o)
    if h.rope:
        cq, sq = (x.to(dtype) for x in _tables(q.shape[-2], q.shape[-1]))
        ck, sk = (x.to(dtype) for x in _tables(k.shape[-2], k.shape[-1]))
        q_r, k_r = q * cq + _rotate_half(q) * sq, k * ck + _rotate_half(k) * sk
    else:
        q_r, k_r = q, k
    g = h.group
    k_all = k_r.repeat_interleave(g, dim=1) if g > 1 else k_r  # repeat_kv
    v_all = v.repeat_interleave(g, dim=1) if g > 1 else v
    scores = q_r @ k_all.transpose(-2, -1) * h.scale
    allowed = None if h.allowed is None else torch.tensor(h.allowed)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    p = torch.softmax(scores, dim=-1)
    # the backward, by hand
    d_p = d_o @ v_all.transpose(-2, -1)
    d_v = p @ d_o if bugs.transposed in ("dv", "both") else p.transpose(-2, -1) @ d_o
    if bugs.diagonal:
        d_s = p * d_p
        row = None
    elif bugs.unweighted is not None:
        kept = d_p if bugs.unweighted == "every" or allowed is None else d_p * allowed
        row = kept.sum(-1)
        d_s = p * (d_p - row[..., None])
    else:
        row = (p * d_p).sum(-1)
        d_s = p * (d_p - row[..., None])
    d_scores = d_s if bugs.scale_missing else d_s * h.scale
    d_q_r = d_scores @ k_all
    d_k_all = (
        d_scores @ q_r if bugs.transposed in ("dk", "both") else d_scores.transpose(-2, -1) @ q_r
    )
    if g > 1:
        b, n_q = d_k_all.shape[0], d_k_all.shape[1]
        if bugs.member is None:
            d_k_r = d_k_all.reshape(b, n_q // g, g, *d_k_all.shape[2:]).sum(2)
            d_v = d_v.reshape(b, n_q // g, g, *d_v.shape[2:]).sum(2)
        else:
            d_k_r, d_v = d_k_all[:, bugs.member :: g], d_v[:, bugs.member :: g]
    else:
        d_k_r = d_k_all
    if h.rope:
        turn = 1.0 if bugs.rope_forward else -1.0
        d_q = d_q_r * cq + turn * _rotate_half(d_q_r) * sq
        d_k = d_k_r * ck + turn * _rotate_half(d_k_r) * sk
    else:
        d_q, d_k = d_q_r, d_k_r
    masked = "grad_masked_scores" if allowed is not None else "grad_scaled_scores"
    out = {
        "grad_weights": d_p,
        masked: d_s,
        "grad_scores": d_scores,
        "grad_q": d_q,
        "grad_k": d_k,
        "grad_v": d_v,
    }
    if row is not None:
        out["row_dot"] = row
    if allowed is not None:
        out["grad_scaled_scores"] = d_s
    return {n: a.detach().to(torch.float64).numpy() for n, a in out.items()}


def autograd(h: Head) -> dict[str, Array]:
    """torch.autograd of the same forward: what the learner's right backward must equal."""
    q, k, v = (torch.tensor(a, requires_grad=True) for a in (h.q, h.k, h.v))
    if h.rope:
        cq, sq = _tables(q.shape[-2], q.shape[-1])
        ck, sk = _tables(k.shape[-2], k.shape[-1])
        q_r, k_r = q * cq + _rotate_half(q) * sq, k * ck + _rotate_half(k) * sk
    else:
        q_r, k_r = q, k
    k_all = k_r.repeat_interleave(h.group, dim=1) if h.group > 1 else k_r
    v_all = v.repeat_interleave(h.group, dim=1) if h.group > 1 else v
    mask = None if h.allowed is None else torch.tensor(h.allowed)
    out = torch.nn.functional.scaled_dot_product_attention(
        q_r, k_all, v_all, attn_mask=mask, scale=h.scale
    )
    out.backward(torch.tensor(h.d_o))
    return {f"grad_{n}": x.grad.numpy() for n, x in (("q", q), ("k", k), ("v", v))}


# ---- the service's side: the forward, its gradients, the diagnosis's setup -----------------


@dataclass
class Case:
    head: Head
    base: State
    setup: Setup


def attention_case(
    rng: np.random.Generator, *, causal: bool = False, rope: bool = False, b: int = 2, n: int = 4,
    d: int = 4, centred_values: bool = False,
) -> Case:  # fmt: skip
    """/attention: q, k, v given, (B, L, d) with L = S; a causal mask, RoPE, as asked."""
    q, k, v = (rng.normal(size=(b, n, d)) for _ in range(3))
    if centred_values:
        v = v - v.mean(axis=-2, keepdims=True)  # Σ_j V_j = 0: rowsum(dP) = dO_i · Σ_j V_j = 0
    d_o = rng.normal(size=(b, n, d))
    scale = 1 / np.sqrt(d)
    specs = (masks.Causal(),) if causal else ()
    combined = masks.combine(list(specs), b, n, n, 0) if causal else None
    variants = Variants(rope=Rope(base=BASE) if rope else None)
    kw: dict[str, Any] = {"variants": variants}
    if combined is not None:
        kw |= {"additive": combined.additive, "padded_queries": combined.padded_queries}
    trace = scaled_dot_product_attention(q, k, v, scale=scale, **kw)
    grads = attention_backward(trace, d_o, **kw)
    base: State = dict(trace.made) | grads
    base = state_of(base, combined)  # the combined mask's arrays, as the comparison keeps them
    setup = Setup(
        scale=scale, d_k=d, fully_masked_policy="zero", variants=variants, mask_specs=specs,
        batch=b, seq_len=n, ctx_len=n,
    )  # fmt: skip
    allowed = None if combined is None else combined.allowed
    return Case(Head(q, k, v, d_o, scale, allowed, rope), base, setup)


def multihead_case(
    rng: np.random.Generator, *, h: int = 4, h_kv: int = 2, causal: bool = True,
    rope: bool = True, b: int = 1, n: int = 4, d: int = 4,
) -> Case:  # fmt: skip
    """/multihead: x projected to h query heads and h_kv key/value heads (GQA), no W_o (the
    block's output is concat), a causal mask and RoPE as asked."""
    d_model = 6
    x = rng.normal(size=(b, n, d_model))
    weights = MultiheadWeights(
        w_q=rng.normal(size=(d_model, h * d)),
        w_k=rng.normal(size=(d_model, h_kv * d)),
        w_v=rng.normal(size=(d_model, h_kv * d)),
    )
    specs = (masks.Causal(),) if causal else ()
    combined = masks.combine(list(specs), b, n, n, 0) if causal else None
    variants = Variants(rope=Rope(base=BASE) if rope else None)
    scale = 1 / np.sqrt(d)
    trace = multihead_attention(
        x, weights, num_heads=h, num_kv_heads=h_kv, mask=combined, variants=variants
    )
    d_y = rng.normal(size=trace.output.shape)
    grads = multihead_backward(
        x, weights, trace, d_y, num_kv_heads=h_kv, mask=combined, variants=variants
    )
    base: State = dict(trace.heads.made) | {n_: a for n_, a in trace.block.items()}
    base |= {"x_in": x, "average_weights": trace.average_weights, "block_output": trace.output}
    base |= grads | {"grad_block_output": d_y}
    base = state_of(base, combined)  # the combined mask's arrays, as the comparison keeps them
    setup = Setup(
        scale=scale, d_k=d, fully_masked_policy="zero", variants=variants, mask_specs=specs,
        batch=b, seq_len=n, ctx_len=n, num_heads=h, num_kv_heads=h_kv, x_in=x,
        projections=weights,
    )  # fmt: skip

    def heads(w: Array, count: int) -> Array:  # x W split into heads: (B, count, L, d)
        return (x @ w).reshape(b, n, count, d).transpose(0, 2, 1, 3)

    d_o = d_y.reshape(b, n, h, d).transpose(0, 2, 1, 3)  # the block's dY per head
    allowed = None if combined is None else combined.allowed[:, None]
    head = Head(
        heads(weights.w_q, h), heads(weights.w_k, h_kv), heads(weights.w_v, h_kv), d_o, scale,
        allowed, rope, h // h_kv, {"x": x, "w_q": weights.w_q, "w_k": weights.w_k,
                                   "w_v": weights.w_v},
    )  # fmt: skip
    return Case(head, base, setup)


def with_projections(head: Head, grads: dict[str, Array]) -> dict[str, Array]:
    """The learner's projections' gradients from their heads' (torch, x W in in_out)."""
    x = torch.tensor(head.extra["x"])

    def merged(a: Array) -> T:  # (B, n, L, d) → (B, L, n·d)
        t = torch.tensor(a)
        return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1)

    parts = {n: merged(grads[f"grad_{n}"]) for n in "qkv"}
    out = dict(grads)
    for n, g in parts.items():
        out[f"grad_w_{n}"] = (x.transpose(-2, -1) @ g).sum(0).numpy()
    dx = sum(g @ torch.tensor(head.extra[f"w_{n}"]).T for n, g in parts.items())
    out["grad_x"] = dx.numpy()
    return out


# ---- the comparison, as the service runs it ----------------------------------------------------


def diagnosed(
    case: Case, yours: dict[str, Array], order: Iterable[str], tol: Tolerance = TIGHT,
    matched: float = 1e-9,
) -> tuple[str, Search]:  # fmt: skip
    """The first of ``order`` where the learner's array differs from the service's (by more
    than ``matched``), and its diagnosis: the earlier ones (they matched) put in place of the
    service's, as the comparison does."""
    base: State = dict(case.base)
    given: dict[str, tuple[int, ...] | None] = {}
    for name in order:
        mine = yours[name]
        assert mine.shape == base[name].shape, name
        if not np.allclose(mine, base[name], rtol=0, atol=matched):
            target = Target(name, None, mine)
            return name, search(base, given, case.setup, target, tol)
        base[name], given[name] = mine, None
    raise AssertionError("every array matched")


def codes(found: Search) -> tuple[str, ...]:
    assert found.found is not None, "nothing reproduces the learner's numbers"
    return found.found.mistakes


FINAL = ("grad_q", "grad_k", "grad_v")  # what a learner checks first (CS231n's grad check)


# ---- the learner's right backward --------------------------------------------------------------


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rope", [False, True])
def test_the_learners_right_backward_is_autograds_and_the_services(
    causal: bool, rope: bool
) -> None:
    """The test's own hand-written backward, right, equals torch.autograd and the service's
    gradients: the wrong ones below differ from it by their bugs alone."""
    case = attention_case(np.random.default_rng(0), causal=causal, rope=rope)
    mine, auto = by_hand(case.head), autograd(case.head)
    for name in FINAL:
        np.testing.assert_allclose(mine[name], auto[name], atol=1e-12)
        np.testing.assert_allclose(mine[name], case.base[name], atol=1e-12)
    for name in ("grad_weights", "grad_scores", "row_dot"):
        np.testing.assert_allclose(mine[name], case.base[name], atol=1e-12)


def test_the_learners_right_backward_of_grouped_heads_is_the_services() -> None:
    case = multihead_case(np.random.default_rng(1))
    mine = with_projections(case.head, by_hand(case.head))
    np.testing.assert_allclose(mine["grad_k"], autograd(case.head)["grad_k"], atol=1e-12)
    for name in (*FINAL, "grad_w_q", "grad_w_k", "grad_w_v", "grad_x"):
        np.testing.assert_allclose(mine[name], case.base[name], atol=1e-11)


def test_a_right_gradient_is_never_given_a_mistake() -> None:
    """In float64 it matches (nothing to diagnose); computed in float32 it is float32's
    rounding, never one of the mistakes."""
    case = attention_case(np.random.default_rng(2), causal=True, rope=True)
    right = by_hand(case.head, dtype=torch.float32)
    _, found = diagnosed(case, right, FINAL)
    assert codes(found) == (FLOAT32,)


# ---- each mistake alone -------------------------------------------------------------------------

ALONE = [
    # (bugs, the array compared first, the codes, the ways named)
    (Bugs(diagonal=True), "grad_masked_scores", ("softmax_grad_diagonal",), {}),
    (Bugs(unweighted="allowed"), "row_dot", ("softmax_grad_row_term_unweighted",),
     {"softmax_grad_row_term_unweighted": "allowed_keys"}),
    (Bugs(unweighted="every"), "row_dot", ("softmax_grad_row_term_unweighted",),
     {"softmax_grad_row_term_unweighted": "every_key"}),
    (Bugs(scale_missing=True), "grad_scores", ("grad_scale_missing",), {}),
    (Bugs(transposed="dv"), "grad_v", ("grad_transposed",), {"grad_transposed": "dv"}),
    (Bugs(transposed="dk"), "grad_k", ("grad_transposed",), {"grad_transposed": "dk"}),
    (Bugs(rope_forward=True), "grad_q", ("rope_grad_not_inverted",), {}),
]  # fmt: skip
STEPS = ("grad_weights", "row_dot", "grad_masked_scores", "grad_scaled_scores", "grad_scores",
         *FINAL)  # fmt: skip


@pytest.mark.parametrize(("bugs", "first", "want", "how"), ALONE)
def test_each_mistake_alone_is_named_at_the_first_gradient_it_changes(
    bugs: Bugs, first: str, want: tuple[str, ...], how: dict[str, str]
) -> None:
    """Every gradient the learner computed, compared in the backward's order: the first that
    differs is the one the mistake changes first, and the mistake is named there."""
    case = attention_case(np.random.default_rng(3), causal=True, rope=True)
    yours = by_hand(case.head, bugs)
    order = [n for n in STEPS if n in yours]
    name, found = diagnosed(case, yours, order)
    assert name == first
    assert codes(found) == want
    assert found.found is not None and dict(found.found.ways) == how
    assert found.alternatives == ()


@pytest.mark.parametrize(("bugs", "first", "want", "how"), ALONE)
def test_each_mistake_alone_is_named_from_the_final_gradients(
    bugs: Bugs, first: str, want: tuple[str, ...], how: dict[str, str]
) -> None:
    """Only dQ, dK, dV given (a gradient check's): the same mistake, from the first of them
    it changes."""
    case = attention_case(np.random.default_rng(4), causal=True, rope=True)
    name, found = diagnosed(case, by_hand(case.head, bugs), FINAL)
    assert codes(found) == want, name


@pytest.mark.parametrize("member", [0, 1])
def test_a_shared_kv_heads_gradient_from_one_query_head(member: int) -> None:
    """dK_j = the first (or the last) query head's of the group, where the group's sum was
    meant: named with the query head taken, on grad_k and on the projections after it."""
    case = multihead_case(np.random.default_rng(5))
    yours = with_projections(case.head, by_hand(case.head, Bugs(member=member)))
    for order in (FINAL, ("grad_w_k",), ("grad_x",)):
        _, found = diagnosed(case, yours, order)
        assert codes(found) == ("kv_grad_not_summed",), order
        assert found.found is not None
        assert dict(found.found.ways) == {"kv_grad_not_summed": float(member)}


def test_each_mistake_alone_on_grouped_heads() -> None:
    case = multihead_case(np.random.default_rng(6))
    for bugs, _, want, _ in ALONE:
        _, found = diagnosed(case, by_hand(case.head, bugs), FINAL)
        assert codes(found) == want, bugs


# ---- pairs ------------------------------------------------------------------------------------

ONE_EACH = {  # one way of each mistake, for the pairs
    "softmax_grad_diagonal": Bugs(diagonal=True),
    "softmax_grad_row_term_unweighted": Bugs(unweighted="every"),
    "grad_scale_missing": Bugs(scale_missing=True),
    "grad_transposed": Bugs(transposed="both"),
    "rope_grad_not_inverted": Bugs(rope_forward=True),
    "kv_grad_not_summed": Bugs(member=1),
}


def _both(a: Bugs, b: Bugs) -> Bugs:
    return Bugs(**{f: getattr(a, f) or getattr(b, f) for f in Bugs.__dataclass_fields__})


PAIRS = [
    p for p in combinations(ONE_EACH, 2) if not any(frozenset(p) <= group for group in EXCLUSIVE)
]


def test_the_pairs_that_can_co_occur_are_tried_and_the_one_that_cannot_is_not() -> None:
    case = multihead_case(np.random.default_rng(7))
    tried = {t.mistakes for t in trials(applicable(case.setup, frozenset(case.base), True), "zero",
                                        ways(case.setup))}  # fmt: skip
    assert frozenset({"softmax_grad_diagonal", "softmax_grad_row_term_unweighted"}) not in tried
    assert len(PAIRS) == 14 and all(frozenset(p) in tried for p in PAIRS)


@pytest.mark.parametrize("pair", PAIRS, ids="+".join)
def test_each_pair_is_named_where_both_change_the_gradient(pair: tuple[str, str]) -> None:
    """Both mistakes in one learner's backward (grouped heads, RoPE, causal): the first final
    gradient that both change is explained by the pair (or, where one of them alone already
    explains the first that differs, by that one: the comparison diagnoses the first)."""
    case = multihead_case(np.random.default_rng(8))
    yours = with_projections(case.head, by_hand(case.head, _both(*(ONE_EACH[c] for c in pair))))
    _, found = diagnosed(case, yours, ("grad_x",))
    assert codes(found) == pair


# ---- when two explanations fit, and when none does ----------------------------------------------


def test_two_explanations_that_fit_equally_are_both_listed() -> None:
    """With values that sum to 0 over the keys, rowsum(dP) = dO_i · Σ_j V_j = 0: a D summed
    unweighted is no D at all, and dS = P ∘ dP is reproduced by both."""
    case = attention_case(np.random.default_rng(9), centred_values=True)
    _, found = diagnosed(case, by_hand(case.head, Bugs(diagonal=True)), FINAL)
    assert codes(found) == ("softmax_grad_diagonal",)
    assert found.alternatives == (("softmax_grad_row_term_unweighted",),)


def test_a_gradient_no_listed_mistake_makes_gets_no_diagnosis() -> None:
    case = attention_case(np.random.default_rng(10), causal=True, rope=True)
    yours = by_hand(case.head)
    yours["grad_v"] = yours["grad_v"] * 2  # dV = 2 Pᵀ dO: no mistake of the table
    _, found = diagnosed(case, yours, FINAL)
    assert found.found is None and found.complete


def test_the_forwards_mistakes_are_not_tried_on_a_gradient_nor_the_backwards_on_the_forward() -> (
    None
):
    case = multihead_case(np.random.default_rng(11))
    backward = applicable(case.setup, frozenset(case.base), True)
    assert set(backward) == set(gradients.CODES)
    assert not set(applicable(case.setup, frozenset(case.base))) & set(gradients.CODES)


def test_the_mistakes_are_tried_where_they_can_happen() -> None:
    case = attention_case(np.random.default_rng(12))  # no RoPE, no heads, L = S
    tried = applicable(case.setup, frozenset(case.base), True)
    assert "rope_grad_not_inverted" not in tried and "kv_grad_not_summed" not in tried
    assert "grad_transposed" in tried
    longer = Setup(**{**case.setup.__dict__, "ctx_len": 5})
    assert "grad_transposed" not in applicable(longer, frozenset(case.base), True)
    unit = Setup(**{**case.setup.__dict__, "scale": 1.0})
    assert "grad_scale_missing" not in applicable(unit, frozenset(case.base), True)
    assert ways(case.setup)["softmax_grad_row_term_unweighted"] == ("allowed_keys",)


# ---- the sentences ------------------------------------------------------------------------------


def test_the_sentences_say_what_to_do_with_the_requests_numbers() -> None:
    case = multihead_case(np.random.default_rng(13))

    def said(*codes_: str, **how: Any) -> str:
        return explain(codes_, Seen(case.setup, "zero", how))

    assert said("softmax_grad_diagonal").startswith("your dS has no −D term")
    assert "(P * dP).sum(-1" in said("softmax_grad_diagonal")
    assert "dP.sum(-1)" in said("softmax_grad_row_term_unweighted",
                                softmax_grad_row_term_unweighted="every_key")  # fmt: skip
    assert "1/s = 2 times ours" in said("grad_scale_missing")
    assert "dV = Pᵀ dO" in said("grad_transposed", grad_transposed="dv")
    assert "dK = dSᵀ Q" in said("grad_transposed", grad_transposed="dk")
    assert "−θ" in said("rope_grad_not_inverted")
    text = said("kv_grad_not_summed", kv_grad_not_summed=1.0)
    assert "query head j·2 + 1" in text and "dk.view(B, 2, 2, S, d).sum(2)" in text
    two = said("grad_scale_missing", "rope_grad_not_inverted")
    assert two.startswith("Two mistakes: (1) your dQ and dK leave out the scale")


def test_the_recomputation_starts_from_the_learners_earlier_gradients() -> None:
    """The learner's dS carries their own rounding (it matches at 1e-5) and their dQ_r-side
    grad_scores is it without the scale: only a recomputation from their dS reproduces it to
    1e-9, as the forward's starts from the caller's earlier arrays."""
    case = attention_case(np.random.default_rng(14), causal=True)
    yours = by_hand(case.head)
    noisy = yours["grad_masked_scores"] * (1 + 1e-6 * np.random.default_rng(15).normal(
        size=yours["grad_masked_scores"].shape))  # fmt: skip
    yours |= {"grad_masked_scores": noisy, "grad_scaled_scores": noisy, "grad_scores": noisy}
    order = ("grad_weights", "grad_masked_scores", "grad_scaled_scores", "grad_scores")
    name, found = diagnosed(case, yours, order, matched=1e-5)
    assert name == "grad_scores" and codes(found) == ("grad_scale_missing",)


def test_a_set_is_recomputed_only_where_it_can_change_the_gradient() -> None:
    def reaches(mistakes: set[str], target: str) -> bool:
        return gradients.reaches(Trial(frozenset(mistakes), "zero"), target)

    assert not reaches({"softmax_grad_diagonal"}, "grad_weights")  # dP comes before dS
    assert reaches({"softmax_grad_diagonal"}, "grad_sinks")  # the softmax's rule makes it
    assert reaches({"softmax_grad_row_term_unweighted"}, "row_dot")
    assert reaches({"softmax_grad_diagonal"}, "grad_q") and reaches(
        {"grad_scale_missing"}, "grad_x"
    )
    assert not reaches({"grad_scale_missing"}, "grad_scaled_scores")
    assert reaches({"rope_grad_not_inverted"}, "grad_k")
    assert not reaches({"rope_grad_not_inverted"}, "grad_k_rotated")
    assert reaches({"kv_grad_not_summed"}, "grad_k") and reaches({"kv_grad_not_summed"}, "grad_w_v")
    assert not reaches({"kv_grad_not_summed"}, "grad_k_rotated")
    assert not reaches({"softmax_grad_diagonal"}, "grad_concat")  # the block's, before the heads
    case = multihead_case(np.random.default_rng(16))
    yours = dict(case.base) | {"grad_concat": case.base["grad_concat"] * 2}
    _, found = diagnosed(case, yours, ("grad_concat",))
    assert found.found is None and found.spent == 0  # no set could change it: none recomputed


def sinks_by_hand(h: Head, sink: float, bugs: Bugs) -> dict[str, Array]:
    """gpt-oss's sink as a learner writes it: one more logit per row, with no value; its
    gradient the sum of that column's dS."""
    q, k, v, d_o = (torch.tensor(a) for a in (h.q, h.k, h.v, h.d_o))
    scores = q @ k.transpose(-2, -1) * h.scale
    column = torch.full((*scores.shape[:-1], 1), sink, dtype=torch.float64)
    p_all = torch.softmax(torch.cat([scores, column], -1), -1)
    p = p_all[..., :-1]
    d_p = torch.cat([d_o @ v.transpose(-2, -1), torch.zeros_like(column)], -1)  # no value
    if bugs.diagonal:
        row = torch.zeros(d_p.shape[:-1], dtype=torch.float64)
    elif bugs.unweighted:
        row = d_p.sum(-1)
    else:
        row = (p_all * d_p).sum(-1)
    d_s = p_all * (d_p - row[..., None])
    out = {"grad_weights": d_p[..., :-1], "grad_scaled_scores": d_s[..., :-1],
           "grad_sinks": d_s[..., -1].sum(), "grad_v": p.transpose(-2, -1) @ d_o}  # fmt: skip
    return {n: a.numpy() for n, a in out.items()}


@pytest.mark.parametrize(
    ("bugs", "code"),
    [(Bugs(diagonal=True), "softmax_grad_diagonal"),
     (Bugs(unweighted="allowed"), "softmax_grad_row_term_unweighted")],
)  # fmt: skip
def test_a_sinks_gradient_with_the_learners_row_term(bugs: Bugs, code: str) -> None:
    """The sink's gradient −Σ P_sink·D: 0 without a D (the diagonal), −Σ P_sink·rowsum(dP)
    with an unweighted one; named from grad_sinks alone."""
    rng = np.random.default_rng(17)
    case = attention_case(rng)
    sink = 0.7
    variants = Variants(sinks=np.asarray(sink))
    h = case.head
    trace = scaled_dot_product_attention(h.q, h.k, h.v, scale=h.scale, variants=variants)
    base: State = dict(trace.made) | attention_backward(trace, h.d_o, variants=variants)
    setup = Setup(**{**case.setup.__dict__, "variants": variants})
    right = sinks_by_hand(h, sink, Bugs())
    np.testing.assert_allclose(right["grad_sinks"], base["grad_sinks"], atol=1e-12)
    np.testing.assert_allclose(right["grad_scaled_scores"], base["grad_scaled_scores"], atol=1e-12)
    _, found = diagnosed(Case(h, base, setup), sinks_by_hand(h, sink, bugs), ("grad_sinks",))
    assert codes(found) == (code,)
