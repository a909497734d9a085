"""The one table of outputs: every name a response can carry, its shape, where it lives and how
it is shown. The names ``include`` accepts, the result-size limits, dropping the batch axis, the
response models (and so /docs) and the explorer's drawings all derive from :data:`OUTPUTS`.

Adding an output is one row here plus its computation: a field of the engine's trace (for a
``head`` row: of :class:`service.core.attention.AttentionTrace`) or a value handed to
:func:`service.trace.returned.body` by :mod:`service.trace.compute`.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Literal

from service.core.latent import LatentDims
from service.trace.shapes import Endpoint, Shapes, by_shapes
from service.wire.errors import FieldError

Kind = Literal[
    "matrix",  # float array [L][·] (a leading [B] when batched)
    "vector",  # float array [L] (a leading [B] when batched)
    "stack",  # float array [h][L][S] (a leading [B] when batched)
    "nullable",  # float array with −∞ as null
    "bool",  # boolean array
    "rows",  # list of row indices (per batch item when batched)
    "summary",  # list of summary rows (per batch item when batched)
    "steps",
    "labels",  # list of strings
    "float",
    "int",
    "conventions",
    "weight",  # a generated matrix, never batched
    "heads",  # /multihead: the list of per-head traces
    "comparison",  # the caller's arrays against the service's
    "name",  # an output's name, or null
    "warnings",
    "check",  # decode_check: {max_abs_diff, steps}
    "blocks",  # online_softmax: one entry per key block
]
ShapeOf = Callable[[Shapes], tuple[int, ...]]
BOTH: frozenset[Endpoint] = frozenset({"attention", "multihead"})
ATTENTION: frozenset[Endpoint] = frozenset({"attention"})
MULTIHEAD: frozenset[Endpoint] = frozenset({"multihead"})


@dataclass(frozen=True)
class View:
    """How the explorer draws an output: a heatmap (``map``: scores, weights or mask colours)
    or a table whose rows are the queries, the keys or plain indices."""

    title: str
    map: Literal["scores", "weights", "mask"] | None = None
    rows: Literal["queries", "keys", "index"] = "queries"
    each_head: bool = False  # on /multihead, drawn for every head
    chain: bool = False  # one of the scores in turn (scaled, capped, biased, masked): each made
    # from the latest present one before it in the table's order, the softmax reads the last


def _everywhere(shapes: Shapes) -> bool:
    """Present in every response."""
    return True


def _on(variant: str) -> Callable[[Shapes], bool]:
    """Present when the variant is on (service.trace.rows.variants)."""
    return lambda shapes: variant in shapes.on


@dataclass(frozen=True)
class Output:
    """One name a response may carry."""

    name: str
    kind: Kind
    doc: str
    shape: ShapeOf | None = None  # per sequence and head; None: not counted as numbers
    endpoints: frozenset[Endpoint] = BOTH
    present: Callable[[Shapes], bool] = _everywhere
    head: bool = False  # one per head: top level on /attention, inside heads[i] on /multihead
    always: bool = False  # returned whatever include says
    batched: bool = True  # gains a leading B when the request is batched
    view: View | None = None

    @property
    def required(self) -> bool:
        """In every response of its endpoints (so the documented schema requires it)."""
        return self.always and self.present is _everywhere


def _lat(s: Shapes) -> LatentDims:
    """The MLA sizes of a request whose mla is on."""
    assert s.latent is not None
    return s.latent


def _cache_shape(d: str, per_head: bool) -> ShapeOf:
    """A cache's shape: ([h_kv,] P + L, d_k or d_v)."""
    return lambda s: (s.num_kv_heads,) * per_head + (s.ctx_len, s.d_k if d == "d_k" else s.d_v)


_ONLINE = ("the softmax a block of keys at a time (with online_softmax): per block "
           '{"keys": [start, end], "m": [L], "l": [L], "o": [L][d_v]}, the running max, sum and '
           "output; the last o is output")  # fmt: skip


def _online(s: Shapes) -> tuple[int, ...]:
    """Per block: m, l and o for every row."""
    return (-(-s.ctx_len // (s.online_block or 1)), s.seq_len, 2 + s.d_v)


def _ls(s: Shapes) -> tuple[int, ...]:
    return (s.seq_len, s.ctx_len)


OUTPUTS: tuple[Output, ...] = (
    # The rows of arrays are in the order of the steps that make them: the steps' list, the
    # comparison's order and the explorer's chain of scores all follow it.
    # the multi-head block's input
    Output("x_in", "matrix", "x after positional encoding (when one is applied)",
           lambda s: (s.seq_len, s.d_model or 0), endpoints=MULTIHEAD,
           present=lambda s: s.positional, view=View("x after positional encoding")),
    # one attention: top level on /attention, per head on /multihead
    Output("q", "matrix", "queries [L][d_k]", lambda s: (s.seq_len, s.d_k), head=True,
           view=View("Q", rows="queries", each_head=True)),
    Output("k", "matrix", "keys [S][d_k] (with past: the new tokens')", lambda s: (s.new_keys, s.d_k), head=True,
           view=View("K", rows="keys", each_head=True)),
    Output("v", "matrix", "values [S][d_v] (with past: the new tokens')", lambda s: (s.new_keys, s.d_v), head=True,
           view=View("V", rows="keys", each_head=True)),
    Output("q_normed", "matrix", "qk_norm(Q) [L][d_k] (when qk_norm is on)",
           lambda s: (s.seq_len, s.d_k), present=_on("qk_norm"), head=True,
           view=View("Q after qk_norm", rows="queries", each_head=True)),
    Output("k_normed", "matrix", "qk_norm(K) [S][d_k] (when qk_norm is on)",
           lambda s: (s.new_keys, s.d_k), present=_on("qk_norm"), head=True,
           view=View("K after qk_norm", rows="keys", each_head=True)),
    # multi-head latent attention (DeepSeek): the latents, then each head's parts of Q and K
    Output("c_q", "matrix", "the queries' latent [L][q_lora_rank], after q_a_layernorm (mla "
           "with q_lora_rank)", lambda s: (s.seq_len, _lat(s).q_lora_rank or 0),
           endpoints=MULTIHEAD, present=lambda s: s.latent is not None and
           s.latent.q_lora_rank is not None, view=View("C_q  query latent")),
    Output("c_kv", "matrix", "the keys' and values' latent [S][kv_lora_rank], what a cache "
           "holds with k_rope (mla)", lambda s: (s.ctx_len, _lat(s).kv_lora_rank),
           endpoints=MULTIHEAD, present=_on("mla"), view=View("C_kv  key/value latent",
           rows="keys")),
    Output("k_rope", "matrix", "the rotated key features [S][qk_rope_head_dim], one per "
           "token, shared by every head (mla)", lambda s: (s.ctx_len, _lat(s).qk_rope_head_dim),
           endpoints=MULTIHEAD, present=_on("mla"), view=View("k_rope  shared key", rows="keys")),
    Output("q_nope", "matrix", "the query features without RoPE [L][qk_nope_head_dim] (mla)",
           lambda s: (s.seq_len, _lat(s).qk_nope_head_dim), present=_on("mla"), head=True,
           endpoints=MULTIHEAD, view=View("q_nope", rows="queries", each_head=True)),
    Output("q_rope", "matrix", "the rotated query features [L][qk_rope_head_dim] (mla)",
           lambda s: (s.seq_len, _lat(s).qk_rope_head_dim), present=_on("mla"), head=True,
           endpoints=MULTIHEAD, view=View("q_rope (rotated)", rows="queries", each_head=True)),
    Output("k_nope", "matrix", "the key features without RoPE [S][qk_nope_head_dim] (mla)",
           lambda s: (s.ctx_len, _lat(s).qk_nope_head_dim), present=_on("mla"), head=True,
           endpoints=MULTIHEAD, view=View("k_nope", rows="keys", each_head=True)),
    Output("q_rotated", "matrix", "RoPE(Q) [L][d_k], what the scores use (when rope is on)",
           lambda s: (s.seq_len, s.d_k), present=_on("rope"), head=True,
           view=View("Q rotated (RoPE)", rows="queries", each_head=True)),
    Output("k_rotated", "matrix", "RoPE(K) [S][d_k] (when rope is on)",
           lambda s: (s.new_keys, s.d_k), present=_on("rope"), head=True,
           view=View("K rotated (RoPE)", rows="keys", each_head=True)),
    Output("q_tempered", "matrix", "the queries times their temperature [L][d_k] (when "
           "temperature is on)", lambda s: (s.seq_len, s.d_k), present=_on("temperature"),
           head=True, view=View("Q × temperature", rows="queries", each_head=True)),
    Output("v_normed", "matrix", "rms_norm(V) [S][d_v], what the output uses (when v_norm is "
           "on)", lambda s: (s.new_keys, s.d_v), present=_on("v_norm"), head=True,
           view=View("V after v_norm", rows="keys", each_head=True)),
    # a decode step's cache after this step: the cached keys, then the new ones normed and rotated
    *(Output(name, "matrix", f"the cache's {what} after this step [P + L][{d}]: past.{name[-1]} "
             f"then the new tokens' (with past)", _cache_shape(d, per_head=False),
             endpoints=ATTENTION, present=lambda s: s.past_len > 0)
      for name, what, d in (("present_k", "keys", "d_k"), ("present_v", "values", "d_v"))),
    *(Output(name, "stack", f"the cache's {what} after this step [h_kv][P + L][{d}]: past."
             f"{name[-1]} then the new tokens' (with past)",
             _cache_shape(d, per_head=True), endpoints=MULTIHEAD,
             present=lambda s: s.past_len > 0)
      for name, what, d in (("present_k", "keys", "d_k"), ("present_v", "values", "d_v"))),
    Output("scores", "matrix", "Q Kᵀ [L][S]", _ls, head=True, view=View("scores  Q Kᵀ", "scores")),
    Output("scaled_scores", "matrix", "Q Kᵀ · scale [L][S]", _ls, head=True,
           view=View("scaled scores", "scores", each_head=True, chain=True)),
    Output("capped_scores", "matrix", "c · tanh(scaled_scores / c) [L][S] (when softcap is on)",
           _ls, present=_on("softcap"), head=True,
           view=View("capped scores  c·tanh(s/c)", "scores", each_head=True, chain=True)),
    Output("position_bias", "matrix", "the ALiBi or T5 bias [L][S] (when one is on)", _ls,
           present=_on("position_bias"), head=True,
           view=View("position bias", "scores", each_head=True)),
    Output("biased_scores", "matrix", "the scores so far plus position_bias [L][S]", _ls,
           present=_on("position_bias"), head=True,
           view=View("scores + position bias", "scores", each_head=True, chain=True)),
    # the combined mask: top level (one for every head), made before it is added
    Output("mask", "bool", "the combined mask [L][S], true = may attend", _ls,
           present=lambda s: s.masked, view=View("mask (1 = may attend)", "mask")),
    Output("additive_mask", "nullable",
           "0 where allowed, null (−∞) where masked, plus additive values", _ls,
           present=lambda s: s.masked),
    Output("masked_scores", "nullable",
           "the scores so far plus the mask; null where masked (only when a mask applies)", _ls,
           present=lambda s: s.masked, head=True,
           view=View("masked scores", "scores", each_head=True, chain=True)),
    Output("sink_weights", "vector", "the weight each query row gives the sink [L] (when "
           "sinks are on); its weights sum to 1 − this", lambda s: (s.seq_len,),
           present=_on("sinks"), head=True),
    Output("weights", "matrix", "row softmax of the final scores [L][S]", _ls,
           head=True, view=View("weights  softmax", "weights", each_head=True)),
    # FlashAttention's computation of the same weights V, a block of keys at a time
    Output("online_softmax", "blocks", _ONLINE, _online, endpoints=ATTENTION,
           present=lambda s: s.online_block is not None, batched=False),  # the batch inside
    Output("online_softmax", "blocks", _ONLINE, _online, endpoints=MULTIHEAD, head=True,
           present=lambda s: s.online_block is not None),
    Output("output", "matrix", "weights V [L][d_v]", lambda s: (s.seq_len, s.d_v), head=True,
           view=View("output")),
    # the multi-head block
    Output("average_weights", "matrix",
           "mean of the heads' weights (nn.MultiheadAttention average_attn_weights=True)", _ls,
           endpoints=MULTIHEAD, view=View("average weights (all heads)", "weights")),
    Output("weights", "stack",
           "every head's weights stacked [h][L][S] (nn.MultiheadAttention "
           "average_attn_weights=False)", lambda s: (s.num_heads, s.seq_len, s.ctx_len),
           endpoints=MULTIHEAD),
    Output("heads", "heads", "h per-head traces", endpoints=MULTIHEAD),
    Output("concat", "matrix", "the heads' outputs side by side [L][h·d_v]",
           lambda s: (s.seq_len, s.num_heads * s.d_v), endpoints=MULTIHEAD, view=View("concat")),
    Output("gate", "matrix", "sigmoid(x W_gᵀ + b_g) [L][h·d_v] (when gate is on)",
           lambda s: (s.seq_len, s.num_heads * s.d_v), endpoints=MULTIHEAD,
           present=_on("gate"), view=View("gate  sigmoid(x W_gᵀ)")),
    Output("gated", "matrix", "concat · gate [L][h·d_v] (when gate is on)",
           lambda s: (s.seq_len, s.num_heads * s.d_v), endpoints=MULTIHEAD,
           present=_on("gate"), view=View("gated concat")),
    Output("projected", "matrix", "(gated) concat W_o + b_o [L][d_out]",
           lambda s: (s.seq_len, s.d_out), endpoints=MULTIHEAD, view=View("concat · W_o")),
    Output("residual", "matrix", "x_in + projected (when asked)",
           lambda s: (s.seq_len, s.d_out), endpoints=MULTIHEAD, present=lambda s: s.residual,
           view=View("residual")),
    Output("layer_norm", "matrix", "layer norm of the residual, or of projected (when asked)",
           lambda s: (s.seq_len, s.d_out), endpoints=MULTIHEAD, present=lambda s: s.layer_norm,
           view=View("layer norm")),
    Output("output", "matrix", "the final result: the last of projected, residual, layer_norm",
           lambda s: (s.seq_len, s.d_out), endpoints=MULTIHEAD, view=View("output")),
    # sizes and conventions, always returned
    Output("scale", "float", "the factor applied to Q Kᵀ", always=True, batched=False),
    Output("num_heads", "int", "h", endpoints=MULTIHEAD, always=True, batched=False),
    Output("num_kv_heads", "int", "key/value heads (h unless grouped-query attention)",
           endpoints=MULTIHEAD, always=True, batched=False),
    Output("mla_cache_numbers", "int", "what a cache holds per token with mla: kv_lora_rank + "
           "qk_rope_head_dim (against h·(d_k + d_v) without)", endpoints=MULTIHEAD,
           present=_on("mla"), batched=False),
    Output("d_k", "int", "width of queries and keys (per head in /multihead)", always=True,
           batched=False),
    Output("d_v", "int", "width of values (per head in /multihead)", always=True, batched=False),
    Output("tokens", "labels", "labels of the L queries, when known", batched=False),
    Output("context_tokens", "labels", "labels of the S keys, when known", batched=False),
    Output("conventions", "conventions", "the conventions this answer was computed with",
           always=True, batched=False),
    # for reading
    Output("summary", "summary",
           "per query row: top key, its weight and the entropy (per batch item when batched; "
           "over average_weights in /multihead)", lambda s: (s.seq_len, 3)),
    Output("steps", "steps", "every operation performed, in order", batched=False),
    Output("warnings", "warnings", "what looks wrong without expected numbers, e.g. a boolean "
           "mask whose polarity looks inverted (only when there is something)",
           present=lambda s: bool(s.warnings), always=True, batched=False),
    # compare with your numbers (when expected is given)
    Output("comparison", "comparison",
           "your expected arrays against the service's, in the order of the steps: whether "
           "each matches, the largest difference and where, and for the first difference the "
           "mistake that reproduces it", present=lambda s: s.comparing, always=True,
           batched=False),
    Output("decode_check", "check", "the sequence at once against a token at a time with a "
           "growing cache: {max_abs_diff, steps} (with check_decode)",
           present=lambda s: s.check_decode, always=True, batched=False),
    Output("first_mismatch", "name", "the earliest compared name that differs, or null",
           present=lambda s: s.comparing, always=True, batched=False),
    # the mask's consequence
    Output("fully_masked_rows", "rows",
           "query rows with no key allowed (per batch item when batched)",
           present=lambda s: s.masked),
    # generated arrays, so the user can reproduce them
    Output("x", "weight", "generated x [L][d_model], when it was generated",
           lambda s: (s.seq_len, s.d_model or 0), present=lambda s: "x" in s.generated,
           batched=False, view=View("x (generated)", rows="index")),
    Output("w_q", "weight", "generated w_q (in_out), when generated",
           lambda s: (s.d_model or 0, s.num_heads * s.d_k), present=lambda s: "w_q" in s.generated,
           batched=False, view=View("w_q (generated)", rows="index")),
    Output("w_k", "weight", "generated w_k (in_out), when generated",
           lambda s: (s.d_model or 0, s.num_kv_heads * s.d_k),
           present=lambda s: "w_k" in s.generated, batched=False,
           view=View("w_k (generated)", rows="index")),
    Output("w_v", "weight", "generated w_v (in_out), when generated",
           lambda s: (s.d_model or 0, s.num_kv_heads * s.d_v),
           present=lambda s: "w_v" in s.generated, batched=False,
           view=View("w_v (generated)", rows="index")),
)  # fmt: skip


_POSITIONS = {id(out): i for i, out in enumerate(OUTPUTS)}
# the scores in turn, each made from the latest present one before it: what a score step adds
# to, and what the softmax reads
CHAIN = tuple(out.name for out in OUTPUTS if out.view is not None and out.view.chain)


@cache
def top_level(endpoint: Endpoint) -> tuple[Output, ...]:
    """The outputs at the top of an endpoint's response, in order."""
    return tuple(
        out
        for out in OUTPUTS
        if endpoint in out.endpoints and not (out.head and endpoint == "multihead")
    )


@cache
def in_heads(endpoint: Endpoint) -> tuple[Output, ...]:
    """The outputs inside each ``heads[i]`` of an endpoint's response (none on /attention)."""
    return tuple(out for out in OUTPUTS if out.head and endpoint == "multihead")


@cache
def _by_name(endpoint: Endpoint) -> dict[str, Output]:
    """Output (and step) names to outputs, computed once; per-head outputs win (a /multihead
    step named "output" is the heads' weights V, not the block's output)."""
    return {o.name: o for o in top_level(endpoint)} | {o.name: o for o in OUTPUTS if o.head}


@cache
def row(endpoint: Endpoint, name: str, per_head: bool = True) -> Output:
    """The row of an output (or a step named after one): the per-head one when ``per_head``
    and the endpoint has one of that name, else the top-level one."""
    if per_head:
        return _by_name(endpoint)[name]
    return next(o for o in top_level(endpoint) if o.name == name)


def position(out: Output) -> int:
    """Where an output's step comes in the order of the steps (the table's order)."""
    return _POSITIONS[id(out)]


@cache
def step_order(endpoint: Endpoint) -> dict[str, int]:
    """Each step name's place in the order of the steps (the table's order; per-head rows win,
    as in :func:`row`), computed once per endpoint."""
    return {name: position(out) for name, out in _by_name(endpoint).items()}


def latest(shapes: Shapes, name: str, among: tuple[str, ...]) -> str:
    """The last of ``among`` (step names, in the table's order) present in this request before
    ``name``: what the step ``name`` is made from (the scores so far, the queries as the
    scores use them)."""
    order = step_order(shapes.endpoint)
    rows = _by_name(shapes.endpoint)
    before = order[name]
    for n in reversed(among):
        if order[n] < before and rows[n].present(shapes):
            return n
    raise ValueError(f"no step of {among} before {name}")


@cache
def includable(endpoint: Endpoint) -> tuple[str, ...]:
    """The names ``include`` accepts for an endpoint."""
    return tuple(out.name for out in top_level(endpoint) if not out.always)


def check_include(endpoint: Endpoint, include: list[str] | None) -> None:
    """Refuse a name in ``include`` that is not an output of the endpoint."""
    if not include:
        return
    names = includable(endpoint)
    for name in include:
        if name not in names:
            raise FieldError(
                "include",
                f'include names "{name[:40]}", which is not an output; choose from {", ".join(names)}',
            )


def _count(out: Output, shapes: Shapes) -> int:
    """How many numbers one output holds, heads and batch included."""
    if out.kind == "heads":
        return sum(_count(o, shapes) for o in in_heads(shapes.endpoint) if o.present(shapes))
    if out.shape is None:
        return 0
    per_head = shapes.num_heads if out.head and shapes.endpoint == "multihead" else 1
    batch = (shapes.batch or 1) if out.batched else 1
    return batch * per_head * math.prod(out.shape(shapes))


def sizes(shapes: Shapes) -> dict[str, int]:
    """How many numbers each top-level output of this request holds (present ones only)."""
    return dict(_sizes(shapes))


@by_shapes
def _sizes(shapes: Shapes) -> dict[str, int]:
    return {
        out.name: _count(out, shapes) for out in top_level(shapes.endpoint) if out.present(shapes)
    }


def drawn_shape(shapes: Shapes, name: str) -> tuple[int, ...]:
    """The shape of a generated array (x, w_q, w_k, w_v): drawn with it, returned with it."""
    out = _by_name(shapes.endpoint)[name]
    assert out.kind == "weight" and out.shape is not None
    return out.shape(shapes)


def step_shape(shapes: Shapes, name: str) -> list[int]:
    """The shape a step named after an output produces, with B (and h on /multihead) in front."""
    out = _by_name(shapes.endpoint)[name]
    assert out.shape is not None
    lead = [shapes.batch] if shapes.batch is not None and out.batched else []
    if out.head and shapes.endpoint == "multihead":
        lead.append(shapes.num_heads)
    return lead + list(out.shape(shapes))
