"""DeepSeek's multi-head latent attention as /multihead's fifth way to give the projections
(API.md, "Multi-head latent attention"): the state dict's fields it reads, the sizes they must
have (checked by the rules, before anything is computed), their conversion into the core's
:class:`~service.core.latent.LatentWeights` (made by the plan), and the row's checks and steps
in :data:`service.trace.rows.variants.VARIANTS`."""

from service.core.latent import LatentDims, LatentWeights
from service.core.types import Array
from service.core.variants import Variants
from service.trace.checks import DOTTED, check_bias, options
from service.trace.rows.rope import Formulas, Req
from service.trace.shapes import Shapes
from service.wire.errors import FieldError
from service.wire.schemas.requests import MultiheadRequest
from service.wire.schemas.variant_fields import QKNormOptions, RopeOptions

# what MLA does not read: another form's projections, and the parts no MLA layer has
_NOT_WITH_MLA = (
    "w_q",
    "w_k",
    "w_v",
    "b_q",
    "b_k",
    "b_v",
    "k_proj_weight",
    "v_proj_weight",
    "q_proj_bias",
    "k_proj_bias",
    "v_proj_bias",
    "in_proj_weight",
    "in_proj_bias",
    "heads",
    "q",
    "k",
    "v",
    "context",
    "positional_encoding",
    "q_norm_weight",
    "k_norm_weight",
)

# the block's options an MLA layer's trace does not have yet
_BLOCK_NOT_WITH_MLA = ("residual", "layer_norm")


def _label(name: str) -> str:
    return DOTTED.get(name, name)


def _matrix(req: MultiheadRequest, name: str, rows: int, cols: int, says: str) -> Array:
    """A state dict weight that must be there, [rows][cols] (out_in)."""
    w = getattr(req, name)
    label = _label(name)
    if w is None:
        raise FieldError(label, f"{label} is missing: mla reads it ({says})")
    if w.shape != (rows, cols):
        got = "×".join(map(str, w.shape))
        raise FieldError(label, f"{label} is {got} but must be {rows}×{cols}: {says}")
    return w  # type: ignore[no-any-return]


def _vector(req: MultiheadRequest, name: str, size: int, says: str) -> None:
    w = getattr(req, name)
    label = _label(name)
    if w is None:
        raise FieldError(label, f"{label} is missing: mla reads it ({says})")
    if w.shape[0] != size:
        raise FieldError(label, f"{label} has {w.shape[0]} entries but {says} has {size}")


def latent_dims(req: MultiheadRequest, d_model: int, h: int) -> LatentDims:
    """The layer's sizes from ``mla``, each weight checked against them (out_in, as
    DeepseekV3Attention's nn.Linear weights)."""
    m = req.mla
    assert m is not None
    for name in _NOT_WITH_MLA:
        if getattr(req, name) is not None:
            raise FieldError(
                _label(name),
                f"{_label(name)} does not apply with mla: an MLA layer projects "
                "through its latents (q_a_proj/q_b_proj or q_proj, kv_a_proj_with_mqa, kv_b_proj)",
            )
    for name in _BLOCK_NOT_WITH_MLA:  # off is False or absent
        if getattr(req, name) not in (None, False):
            raise FieldError(
                name,
                f"{name} does not apply with mla yet: the service's block after the heads is "
                "W_o only for an MLA layer (DeepseekV3Attention has no residual or norm inside); "
                f"leave {name} out and add x, or the decoder layer's norm, to the output yourself",
            )
    dims = LatentDims(
        m.q_lora_rank, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim
    )
    d_q = h * (dims.qk_nope_head_dim + dims.qk_rope_head_dim)
    if dims.q_lora_rank is None:
        if req.q_a_proj_weight is not None or req.q_b_proj_weight is not None:
            raise FieldError("mla.q_lora_rank", "q_a_proj/q_b_proj are given: give mla.q_lora_rank")
        _matrix(
            req,
            "q_proj_weight",
            d_q,
            d_model,
            "h·(qk_nope_head_dim + qk_rope_head_dim) rows from x",
        )
    else:
        r_q = dims.q_lora_rank
        if req.q_proj_weight is not None:
            raise FieldError(
                "q_proj.weight",
                "with mla.q_lora_rank the queries come from "
                "q_a_proj and q_b_proj, not q_proj.weight",
            )
        _matrix(req, "q_a_proj_weight", r_q, d_model, "q_lora_rank rows from x")
        _vector(req, "q_a_layernorm_weight", r_q, "q_lora_rank")
        _matrix(
            req,
            "q_b_proj_weight",
            d_q,
            r_q,
            "h·(qk_nope_head_dim + qk_rope_head_dim) rows from the latent",
        )
        check_bias(req.q_a_proj_bias, "q_a_proj.bias", r_q, "q_a_proj.weight")
    kv_a = dims.kv_lora_rank + dims.qk_rope_head_dim
    _matrix(
        req,
        "kv_a_proj_with_mqa_weight",
        kv_a,
        d_model,
        "kv_lora_rank + qk_rope_head_dim rows from x",
    )
    _vector(req, "kv_a_layernorm_weight", dims.kv_lora_rank, "kv_lora_rank")
    kv_b = h * (dims.qk_nope_head_dim + dims.v_head_dim)
    _matrix(
        req,
        "kv_b_proj_weight",
        kv_b,
        dims.kv_lora_rank,
        "h·(qk_nope_head_dim + v_head_dim) rows from the latent",
    )
    check_bias(
        req.kv_a_proj_with_mqa_bias, "kv_a_proj_with_mqa.bias", kv_a, "kv_a_proj_with_mqa.weight"
    )
    return dims


def latent_weights(req: MultiheadRequest, w_o: Array | None, b_o: Array | None) -> LatentWeights:
    """The checked state dict in the core's in_out layout."""
    m = req.mla
    assert m is not None and req.kv_a_proj_with_mqa_weight is not None
    assert req.kv_a_layernorm_weight is not None and req.kv_b_proj_weight is not None
    w_q = req.q_proj_weight if m.q_lora_rank is None else req.q_b_proj_weight
    assert w_q is not None
    return LatentWeights(
        w_q=w_q.T,
        w_kv_a=req.kv_a_proj_with_mqa_weight.T,
        kv_norm=req.kv_a_layernorm_weight,
        w_kv_b=req.kv_b_proj_weight.T,
        w_q_a=None if req.q_a_proj_weight is None else req.q_a_proj_weight.T,
        q_norm=req.q_a_layernorm_weight,
        b_q_a=req.q_a_proj_bias,
        b_kv_a=req.kv_a_proj_with_mqa_bias,
        w_o=w_o,
        b_o=b_o,
        eps=m.eps,
    )


def check_latent(req: Req, shapes: Shapes) -> None:
    """What an MLA layer has and has not: RoPE on its rope features, no QK-norm, no gate."""
    assert isinstance(req, MultiheadRequest) and shapes.latent is not None
    rope = options(req.rope, RopeOptions)
    if rope is None:
        raise FieldError("rope", "mla needs rope: its qk_rope_head_dim features turn")
    r = shapes.latent.qk_rope_head_dim
    if rope.rotary_dim is not None and rope.rotary_dim != r:
        raise FieldError(
            "rope.rotary_dim",
            f"with mla the rotated features are the "
            f"qk_rope_head_dim = {r}: leave rope.rotary_dim out",
        )
    if rope.style == "proportional" or r % 2:
        raise FieldError("rope", f"mla turns pairs of its {r} rope features, half or interleaved")
    for name, on in (
        ("qk_norm", options(req.qk_norm, QKNormOptions) is not None),
        ("gate", req.gate is not False),
        ("k_eq_v", req.k_eq_v),
    ):
        if on:
            raise FieldError(name, f"{name} does not apply with mla: no MLA layer has it")


def latent_steps(v: Variants, bias: object, s: Shapes) -> Formulas:
    """The latents' steps, and Q and K as the scores use them."""
    d = s.latent
    assert d is not None and v.rope is not None
    nope, r, h = d.qk_nope_head_dim, d.qk_rope_head_dim, s.num_heads
    style = (
        "interleaved pairs (2i, 2i + 1), returned as DeepSeek lays them (first members, "
        "then second members)"
        if v.rope.style == "interleaved"
        else "half style"
    )
    steps = {
        "c_kv": f"[C_kv | k_pe] = X W_kvaᵀ (kv_a_proj_with_mqa), C_kv = C_kv / √(mean(C_kv²) + "
        f"eps) · w (kv_a_layernorm): a cache holds C_kv and k_rope, {d.cache_numbers} numbers a "
        f"token, against h·(d_k + d_v) = {h * (nope + r + d.v_head_dim)} without MLA",
        "k_rope": f"RoPE(k_pe) over its {r} features ({style}), one key for all {h} heads",
        "q": f"Q = {'C_q W_qbᵀ' if d.q_lora_rank else 'X W_qᵀ'} split into {h} heads of "
        f"{nope} + {r} features",
        "k": "K = [k_nope | k_pe] before RoPE, k_pe the same for every head",
        "v": f"V = the last {d.v_head_dim} features of each head of C_kv W_kvbᵀ",
        "q_nope": f"the first {nope} features of each head of Q",
        "q_rope": f"RoPE of its last {r} features ({style})",
        "k_nope": f"[k_nope | V] = C_kv W_kvbᵀ (kv_b_proj) split into {h} heads; k_nope = the "
        f"first {nope} features, V the other {d.v_head_dim}",
        "q_rotated": "Q_r = [q_nope | q_rope]",
        "k_rotated": "K_r = [k_nope | k_rope], k_rope the same for every head",
    }
    if d.q_lora_rank:
        steps["c_q"] = "C_q = (X W_qaᵀ) / √(mean((X W_qaᵀ)²) + eps) · w (q_a_proj, q_a_layernorm)"
    return steps
