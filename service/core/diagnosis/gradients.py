"""The backward pass as a caller with a mistake computes it, for the diagnosis of gradients
(API.md, "The backward pass, every step": "Compare works on gradients"). The engine's backward
(:func:`service.core.backward.backward` over the steps of :data:`service.core.chain.HEAD` and
``BLOCK``, each with its rule :attr:`~service.core.chain.Step.back`) is run as it is, with a
wrong rule put in place of a step's where a trial's mistake changes it (:data:`BACK_CHANGES`,
by the kind of step, as :data:`service.core.diagnosis.stages.CHANGES` for the forward), and
grouped-query attention's sum over each key/value head's group replaced by one query head's
share under ``kv_grad_not_summed``. The projections and the block are stated here as
:func:`service.core.backward.multihead_backward` states them. On DeepSeek's multi-head latent
attention (MLA) the heads' backward ends at the Q and K the scores read, and the rest is the
core's own :func:`service.core.latent.latents_backward`, with its RoPE transpose or its sum over
the heads of the one shared rope key replaced where a mistake changes them (the table's
``latent`` rules). The caller's earlier gradients
(they matched) are put in place of the recomputed ones as the walk reaches them, as the
forward's recomputation starts from the caller's earlier arrays.

The mistakes' rows (when each is tried, its ways, its sentence) are in
:mod:`service.core.diagnosis.mistakes`; the search (:mod:`service.core.diagnosis.search`)
runs :func:`gradient_recomputations` in place of the forward's recomputations when the array
to explain is a gradient. Engine shapes as the forward's stages. NumPy only, no I/O."""

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from service.core import chain
from service.core.backward import (
    PER_KV_HEAD,
    backward,
    projections_backward,
    summed_per_kv_head,
    values_read_as_keys,
)
from service.core.block import merge_heads
from service.core.diagnosis.stages import Setup, State, Trial, Unfit, Way
from service.core.latent import LatentRules, latents_backward, turned
from service.core.linear import transposed
from service.core.types import Array, BoolArray, FullyMaskedPolicy
from service.core.variants import Variants

Given = Mapping[str, tuple[int, ...] | None]  # the caller's arrays: all heads (None) or some
Keep = Callable[[str, Array], Array]  # a gradient by name → the one the walk goes on with
View = Callable[[Mapping[str, Array]], Array]  # the gradients by name → one as the caller has it

DIAGONAL = "softmax_grad_diagonal"
UNWEIGHTED = "softmax_grad_row_term_unweighted"
SCALE_MISSING = "grad_scale_missing"
TRANSPOSED = "grad_transposed"
ROPE_FORWARD = "rope_grad_not_inverted"
NOT_SUMMED = "kv_grad_not_summed"
CODES = (DIAGONAL, UNWEIGHTED, SCALE_MISSING, TRANSPOSED, ROPE_FORWARD, NOT_SUMMED)
"""The contract's backward mistakes, in its table's order."""

# how D was summed under softmax_grad_row_term_unweighted: over the keys the mask allows
# ((dP * mask).sum(-1)), or over every key of the row, masked ones included (dP.sum(-1))
ALLOWED_KEYS: Way = "allowed_keys"
EVERY_KEY: Way = "every_key"
# which transpose grad_transposed left out: dV = P dO, dK = dS Q (· s), or both
DV: Way = "dv"
DK: Way = "dk"
BOTH: Way = "both"

SEED = {False: "grad_output", True: "grad_block_output"}
"""The gradient the backward starts from, by whether there are heads: ∂loss/∂output on
/attention, ∂loss/∂(the block's last array) on /multihead (its ``block_output``)."""


def own_rows(s: Setup) -> Trial:
    """No mistake: the backward as the engine computes it."""
    return Trial(frozenset(), "uniform" if s.fully_masked_policy == "uniform" else "zero")


def is_gradient(name: str) -> bool:
    """Whether ``name`` is an array of the backward (a ``grad_*`` or D, ``row_dot``)."""
    return name.startswith("grad_") or name == "row_dot"


def seed_name(s: Setup) -> str:
    return SEED[s.num_heads is not None]


# ---- the backward's rules, with the mistakes put into them ------------------------------


LatentRule = Callable[[LatentRules, Setup, Trial], LatentRules]
"""MLA's rules (:class:`service.core.latent.LatentRules`) with a wrong one put in place."""


@dataclass(frozen=True)
class BackChange:
    """How mistakes change the backward rule of one kind of step (:attr:`chain.Step.kind`):
    ``back`` gives the rule the step runs under a trial with any of ``mistakes``; ``latent``,
    the rule of MLA's backward through the latents they change instead on an MLA layer (its
    heads' chain has no RoPE step: it turns only its rope features, in the latents)."""

    mistakes: frozenset[str]
    back: Callable[[chain.Step, Setup, Trial], chain.Back] | None = None
    latent: LatentRule | None = None


def _changes(kind: str, t: Trial, mla: bool) -> BackChange | None:
    """The change the mistakes of ``t`` make to the chain's steps of ``kind``: none where they
    change none, or, on an MLA layer (``mla``), a rule of the latents instead."""
    change = BACK_CHANGES.get(kind)
    if change is None or change.back is None or not change.mistakes & t.mistakes:
        return None
    return None if mla and change.latent is not None else change


def _own(step: chain.Step) -> chain.Back:
    assert step.back is not None, f"the step {step.name} has no backward rule"
    return step.back


def _softmax_back(step: chain.Step, s: Setup, t: Trial) -> chain.Back:
    """dS = P ∘ (dP − D) with the caller's D: none (``softmax_grad_diagonal``: dS = P ∘ dP,
    the Jacobian taken as its diagonal), or rowsum(dP) (``softmax_grad_row_term_unweighted``:
    over the allowed keys, or over every key) where rowsum(P ∘ dP) was meant. The rest as the
    engine's rule (:func:`service.core.chain._weights_back`): 0 on rows the ``uniform`` policy
    filled, a sink's gradient −Σ P_sink·D with the D used; ``row_dot`` is the D used (none
    under the diagonal)."""
    diagonal = DIAGONAL in t.mistakes
    every = not diagonal and t.way(UNWEIGHTED) == EVERY_KEY

    def back(g: Array, logits: Array, st: chain.State, hs: chain.Setup) -> chain.Grads:
        p = st.made["weights"]  # (..., L, S)
        if diagonal:
            used = np.zeros(p.shape[:-1])  # (..., L)
        else:
            additive = hs.additive
            allowed = g if every or additive is None else np.where(np.isneginf(additive), 0.0, g)
            used = allowed.sum(axis=-1)
        ds = p * (g - used[..., None])  # (..., L, S)
        sinks = s.variants.sinks
        filled = st.fully_masked_rows
        if sinks is None and hs.fully_masked_policy == "uniform" and filled is not None:
            ds[np.broadcast_to(filled, used.shape)] = 0.0
        out: chain.Grads = {"scores": ds} | ({} if diagonal else {"row_dot": used})
        if sinks is not None:
            share = -st.made["sink_weights"] * used  # (..., L): 0 under the diagonal
            out["grad_sinks"] = (
                np.moveaxis(share, -2, 0).reshape(share.shape[-2], -1).sum(axis=1)
                if np.ndim(sinks) == 1
                else np.asarray(share.sum())
            )
        return out

    return back


def _unscaled_back(step: chain.Step, s: Setup, t: Trial) -> chain.Back:
    """The scale left out on the way back: grad_scores = grad_scaled_scores."""
    return lambda g, scores, st, hs: {"scores": g}


def _square(g: Array) -> None:
    """A transpose left out goes unnoticed only where the shapes allow it (L = S)."""
    if g.shape[-1] != g.shape[-2]:
        raise Unfit


def _scores_back(step: chain.Step, s: Setup, t: Trial) -> chain.Back:
    """dK = dS Q (the keys' gradient without dS's transpose) where dK = dSᵀ Q was meant."""
    if t.way(TRANSPOSED) == DV:
        return _own(step)

    def back(g: Array, q: Array, st: chain.State, hs: chain.Setup) -> chain.Grads:
        _square(g)
        return {"q": g @ st["k"], "k": g @ q}  # (..., L, d_k), (..., S = L, d_k)

    return back


def _output_back(step: chain.Step, s: Setup, t: Trial) -> chain.Back:
    """dV = P dO (without P's transpose) where dV = Pᵀ dO was meant."""
    if t.way(TRANSPOSED) == DK:
        return _own(step)

    def back(g: Array, weights: Array, st: chain.State, hs: chain.Setup) -> chain.Grads:
        _square(weights)
        return {"weights": g @ transposed(st["v"]), "v": weights @ g}

    return back


def _rope_forward_back(step: chain.Step, s: Setup, t: Trial) -> chain.Back:
    """The gradient turned by the forward's rotation (+θ, with its attention factor) where
    its transpose (−θ) was meant: the step's own ``run`` applied to the gradient."""
    return lambda g, x, st, hs: {step.reads: step.run(g, st, hs)}


def _rope_forward_latent(rules: LatentRules, s: Setup, t: Trial) -> LatentRules:
    """MLA: the rope features' gradients (q_pe's, the shared k_pe's) turned by the forward's
    rotation, DeepSeek's interleaved layout as the forward lays it out (its
    ``apply_rotary_pos_emb_interleave`` applied to the gradient)."""
    return replace(rules, turn_back=turned)


def _one_head_latent(rules: LatentRules, s: Setup, t: Trial) -> LatentRules:
    """MLA under ``kv_grad_not_summed``: the shared rope key's gradient taken from the r-th
    query head's share, (B, h, S, r) → (B, S, r), where the sum over the heads was meant."""
    r = int(t.way(NOT_SUMMED))
    return replace(rules, shared=lambda g: g[:, r])


BACK_CHANGES: dict[str, BackChange] = {
    "softmax": BackChange(frozenset({DIAGONAL, UNWEIGHTED}), _softmax_back),
    "scale": BackChange(frozenset({SCALE_MISSING}), _unscaled_back),
    "scores": BackChange(frozenset({TRANSPOSED}), _scores_back),
    "output": BackChange(frozenset({TRANSPOSED}), _output_back),
    "rotate": BackChange(frozenset({ROPE_FORWARD}), _rope_forward_back, _rope_forward_latent),
    "share": BackChange(frozenset({NOT_SUMMED}), latent=_one_head_latent),
}
"""How the backward mistakes change the rules of the chain's steps, by the kind of step (RoPE
on the queries and on the keys alike), and on an MLA layer those of its latents' backward
(``latent``); ``kv_grad_not_summed`` changes the sum after the heads: grouped-query
attention's over each key/value head's group (:func:`_per_kv_head`), MLA's over the heads that
share its one rope key (``share``, no step of the chain)."""
# which gradients of MLA's latents each change of their rules reaches, by the kind in
# BACK_CHANGES (every change of the heads' chain reaches all of them)
_LATENT_REACHES: dict[str, frozenset[str]] = {
    "rotate": frozenset(
        {
            "grad_q",
            "grad_k",
            "grad_c_q",
            "grad_w_q",
            "grad_q_a_norm_weight",
            "grad_w_q_a",
            "grad_b_q_a",
            "grad_w_kv_a",
            "grad_b_kv_a",
            "grad_x",
        }
    ),
    "share": frozenset({"grad_k_rope", "grad_w_kv_a", "grad_b_kv_a", "grad_x"}),
}


def _latent_rules(s: Setup, t: Trial, keep: Keep) -> LatentRules:
    """The rules of MLA's backward through the latents under ``t``, the caller's gradients
    put in place as the walk reaches them."""
    rules = LatentRules(keep=keep)
    for change in BACK_CHANGES.values():
        if change.latent is not None and change.mistakes & t.mistakes:
            rules = change.latent(rules, s, t)
    return rules


def _steps(steps: Sequence[chain.Step], s: Setup, t: Trial, keep: Keep) -> list[chain.Step]:
    """The steps with their rules under ``t``, each reading the caller's gradient of what it
    made where they gave it (``keep``)."""
    out = []
    for step in steps:
        change = _changes(step.kind, t, s.latent is not None)
        rule = _own(step) if change is None or change.back is None else change.back(step, s, t)
        out.append(replace(step, back=_kept(step.name, rule, keep)))
    return out


def _kept(name: str, rule: chain.Back, keep: Keep) -> chain.Back:
    grad = f"grad_{name}"
    return lambda g, x, st, hs: rule(keep(grad, g), x, st, hs)


# ---- the whole backward under a trial --------------------------------------------------

_HEAD_NAMES = (*chain.ORDER, "position_bias", "sink_weights")
_BLOCK_NAMES = tuple(step.name for step in chain.BLOCK)


def _per_heads(base: State, s: Setup, name: str) -> Array:
    """A (B, L, ·) mask array with a heads axis on /multihead: (B, 1, L, ·)."""
    return base[name] if s.num_heads is None else base[name][:, None]


def _head_setup(base: State, s: Setup) -> chain.Setup:
    """The head's chain setup as the engine ran it: the request's mask and policy, the cache;
    on an MLA layer without RoPE (its Q and K come rotated in part, as the scores read them)."""
    additive = _per_heads(base, s, "additive_mask") if "additive_mask" in base else None
    padded = _per_heads(base, s, "padded_queries") if "padded_queries" in base else None
    policy: FullyMaskedPolicy = "uniform" if s.fully_masked_policy == "uniform" else "zero"
    return chain.Setup(
        s.variants if s.latent is None else replace(s.variants, rope=None),
        s.scale,
        additive,
        None if padded is None else padded.astype(bool),
        policy,
        s.past,
        refuse=False,
    )


def _fully_masked(setup: chain.Setup, weights: Array) -> BoolArray | None:
    """The rows where the mask allows no key (padded ones left out), as the softmax flagged
    them, (..., L)."""
    if setup.additive is None:
        return None
    rows = np.broadcast_to(np.isneginf(setup.additive).all(axis=-1), weights.shape[:-1])
    if setup.padded_queries is not None:
        rows = rows & ~setup.padded_queries
    return np.asarray(rows)


def _per_kv_head(grads: dict[str, Array], s: Setup, t: Trial) -> dict[str, Array]:
    """grad_k, grad_v (and the cache's) of the h query heads' copies, per key/value head:
    summed over each group, or under ``kv_grad_not_summed`` taken from the r-th query head of
    each group (key/value head j serves query heads j·g … j·g + g − 1)."""
    h, h_kv = s.num_heads, s.num_kv_heads
    if h is None or h_kv is None or h_kv == h:
        return grads
    g = h // h_kv
    if NOT_SUMMED in t.mistakes:
        r = int(t.way(NOT_SUMMED))
        return grads | {n: grads[n][:, r::g] for n in PER_KV_HEAD if n in grads}
    return summed_per_kv_head(grads, h_kv)


def _block(base: State, s: Setup, t: Trial, keep: Keep, seed: Array) -> dict[str, Array]:
    """The block's gradients (/multihead), from the seed back to the heads' output."""
    setup = chain.Setup(
        Variants(),
        w_o=s.w_o,
        b_o=s.b_o,
        gate=base.get("gate"),
        x_in=s.x_in,
        residual=s.residual,
        norm=s.norm,
    )
    made = {"output": base["output"]} | {n: base[n] for n in _BLOCK_NAMES if n in base}
    return backward(_steps(chain.BLOCK, s, t, keep), chain.State(made, {}), setup, seed)


def _projections(base: State, s: Setup, grads: dict[str, Array], keep: Keep) -> dict[str, Array]:
    """The projections' gradients where they were computed (``grad_w_q`` … in in_out,
    ``grad_b_*``, the gate's, ``grad_x`` with the residual's share folded in, ``grad_context``),
    as :func:`service.core.backward.multihead_backward` makes them; the heads' gradients
    merged back side by side on /multihead."""
    p, x = s.projections, s.x_in
    if p is None or x is None:
        return grads
    merge = merge_heads if s.num_heads is not None else (lambda a: a)
    out = dict(grads)
    residual = keep("grad_x_in", out.pop("grad_x_in")) if "grad_x_in" in out else None
    gate = base.get("gate")
    if gate is not None and getattr(p, "w_g", None) is None:  # a gate with no weights to learn
        gate = None
    return out | projections_backward(
        x,
        s.context,
        p,
        {n: merge(keep(f"grad_{n}", grads[f"grad_{n}"])) for n in "qkv"},
        residual=residual,
        gate=None if gate is None else (gate, keep("grad_gate", out["grad_gate"])),
    )


def gradients(base: State, s: Setup, t: Trial, keep: Keep) -> dict[str, Array]:
    """Every gradient of the computation in ``base`` (its forward arrays by name, engine
    shapes, a decode step's cache per query head, and the seed :func:`seed_name`) as a caller
    with the mistakes of ``t`` computes them, the caller's gradients put in place as the walk
    reaches them (``keep``). Raises :class:`Unfit` where a mistake cannot happen here."""
    seed = keep(seed_name(s), base[seed_name(s)])
    grads: dict[str, Array] = {}
    if s.num_heads is not None:
        grads = _block(base, s, t, keep, seed)
        seed = grads["grad_output"]
    setup = _head_setup(base, s)
    made = {n: base[n] for n in _HEAD_NAMES if n in base}
    state = chain.State(made, {}, _fully_masked(setup, base["weights"]))
    grads |= backward(_steps(chain.HEAD, s, t, keep), state, setup, seed)
    if s.latent is not None:  # grad_q_rotated, grad_k_rotated, grad_v: back through the latents
        assert s.variants.rope is not None, "MLA turns its rope features"
        return grads | latents_backward(
            s.latent,
            grads,
            settings=s.variants.rope,
            positions=s.variants.positions,
            rules=_latent_rules(s, t, keep),
        )
    grads = _projections(base, s, _per_kv_head(grads, s, t), keep)
    return values_read_as_keys(grads) if s.values_are_keys else grads


# ---- what a trial reaches, and running the trials ----------------------------------------

# the gradients a step's rule makes besides that of what it read, by the step's name
_EXTRAS: dict[str, str] = {
    "row_dot": "weights",
    "grad_sinks": "weights",
    "grad_position_bias": "biased_scores",
    "grad_past_k": "present_k",
    "grad_past_v": "present_v",
    "grad_w_o": "projected",
    "grad_b_o": "projected",
    "grad_gate": "gated",
    "grad_ln_gamma": "layer_norm",
    "grad_ln_beta": "layer_norm",
    "grad_x_in": "residual",
} | {f"grad_{n}_norm_{p}": f"{n}_normed" for n in "qkv" for p in ("weight", "bias")}
_ORDER = (*chain.ORDER, *_BLOCK_NAMES, "block_output")  # every name in the forward's order


def _made_at(target: str) -> tuple[int, bool]:
    """Where the target's gradient comes from in the forward's order: the index of the name it
    is the gradient of (False), or of the step whose rule makes it besides (True); −1 for the
    projections' (every change reaches them)."""
    if target in _EXTRAS:
        return _ORDER.index(_EXTRAS[target]), True
    name = target.removeprefix("grad_")
    return (_ORDER.index(name), False) if name in _ORDER else (-1, False)


def reaches(t: Trial, target: str, mla: bool = False) -> bool:
    """Whether the mistakes of ``t`` can change the ``target`` gradient: one changes the rule
    of a step that the walk back reaches before it (a step after the name it is the gradient
    of, or at or after the step that makes it besides), or the per-key/value-head sum that
    grad_k, grad_v, the cache's and the projections' come after; on an MLA layer (``mla``), a
    rule of its latents' backward that makes the target or what it is made from."""
    at, besides = _made_at(target)
    changed = [
        _ORDER.index(step.name) for step in chain.HEAD if _changes(step.kind, t, mla) is not None
    ]
    if any(i > at or (besides and i == at) for i in changed):
        return True
    if mla:
        return any(
            target in _LATENT_REACHES[kind]
            for kind, change in BACK_CHANGES.items()
            if change.latent is not None and change.mistakes & t.mistakes
        )
    summed = at == -1 or target in PER_KV_HEAD
    return NOT_SUMMED in t.mistakes and summed


def _keeper(base: State, given: Given, target: str) -> Keep:
    """The caller's gradient (the heads they gave of it) in place of the recomputed one, never
    the target's."""

    def keep(name: str, made: Array) -> Array:
        heads = given.get(name, ())
        if name == target or heads == () or name not in base:
            return made
        if heads is None or made.shape != base[name].shape:
            return base[name]
        out = made.copy()
        out[:, list(heads)] = base[name][:, list(heads)]
        return out

    return keep


def _numbers(base: State) -> int:
    """The numbers one backward computes: a gradient as large as each forward array."""
    return sum(a.size for n, a in base.items() if n in _ORDER or n in ("gate", "block_output"))


def gradient_cost(
    base: State, given: Given, s: Setup, variants: Sequence[Trial], target: str
) -> int:
    """The numbers recomputing one set of mistakes with all its variants computes: a whole
    backward per variant, 0 when the mistakes cannot change the target."""
    return (
        len(variants) * _numbers(base) if reaches(variants[0], target, s.latent is not None) else 0
    )


def gradient_recomputations(
    base: State,
    given: Given,
    s: Setup,
    variants: Sequence[Trial],
    target: str,
    check: Callable[[], None] = lambda: None,
    view: View | None = None,
) -> Iterator[tuple[Trial, Array]]:
    """The ``target`` gradient recomputed under each variant of one set of mistakes (those
    that cannot happen here left out, none when the mistakes cannot change it); with a
    ``view``, what it makes of all the recomputed gradients (a parameter's gradient in the
    caller's layout, under their module's name)."""
    if not reaches(variants[0], target, s.latent is not None):
        return
    keep = _keeper(base, given, target)
    for trial in variants:
        check()
        try:
            with np.errstate(all="ignore"):
                grads = gradients(base, s, trial, keep)
                made = grads.get(target) if view is None else view(grads)
        except Unfit:
            continue
        if made is not None:
            yield trial, made
