"""The forward's rows of the one table of outputs (:mod:`service.trace.outputs` joins them with
the backward's, :mod:`service.trace.gradient_outputs`): what a row is (its kind, shape, where it
lives, how it is drawn), the request's sizes a shape is read from, the kinds of rows, and every
array the forward can return, in the order of its steps."""

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Literal

from service.trace.shapes import Endpoint, Shapes

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
    "backward_blocks",  # online_softmax_backward: one entry per key block
    "numbers",  # a short list of floats for the whole request (θ_i, slopes), never batched
    "integers",  # a short list of integers for the whole request (positions), never batched
    "tensor",  # a parameter's gradient shaped as the parameter: a number, [n] or [h][n]
    "tensors",  # grad_state_dict: {the request's name: its gradient}
]
ShapeOf = Callable[[Shapes], tuple[int, ...]]
Presence = Callable[[Shapes], bool]
HeatMap = Literal["scores", "weights", "mask"]
BOTH: frozenset[Endpoint] = frozenset({"attention", "multihead"})
ATTENTION: frozenset[Endpoint] = frozenset({"attention"})
MULTIHEAD: frozenset[Endpoint] = frozenset({"multihead"})


@dataclass(frozen=True)
class View:
    """How the explorer draws an output: a heatmap (``map``: scores, weights or mask colours)
    or a table whose rows are the queries, the keys or plain indices."""

    title: str
    map: HeatMap | None = None
    rows: Literal["queries", "keys", "index"] = "queries"
    each_head: bool = False  # on /multihead, drawn for every head
    chain: bool = False  # one of the scores in turn (scaled, capped, biased, masked): each made
    # from the latest present one before it in the table's order, the softmax reads the last


def _everywhere(shapes: Shapes) -> bool:
    """Present in every response."""
    return True


@dataclass(frozen=True)
class Output:
    """One name a response may carry."""

    name: str
    kind: Kind
    doc: str
    shape: ShapeOf | None = None  # per sequence and head; None: not counted as numbers
    endpoints: frozenset[Endpoint] = BOTH
    present: Presence = _everywhere
    head: bool = False  # one per head: top level on /attention, inside heads[i] on /multihead
    always: bool = False  # returned whatever include says
    batched: bool = True  # gains a leading B when the request is batched
    view: View | None = None
    optional: bool = False  # returned when computed (a gradient of a parameter the request gave)
    asked: bool = False  # returned only when include names it (the cache's gradients)

    @property
    def required(self) -> bool:
        """In every response of its endpoints (so the documented schema requires it)."""
        return self.always and self.present is _everywhere


# ---------------------------------------------------------------- sizes, rows and presence


@dataclass(frozen=True)
class Dim:
    """A size of the request, read from its shapes: an attribute of :class:`Shapes` (a dotted
    path for the MLA sizes, ``latent.kv_lora_rank``) or the product of several (``H * D_V``).
    A size the request leaves out (d_model in direct mode, q_lora_rank without a query latent)
    counts 0."""

    names: tuple[str, ...]
    # each name's reader (operator.attrgetter follows a dotted path), made once: a small answer
    # reads about 40 sizes for its steps' shapes
    readers: tuple[Callable[[Shapes], Any], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "readers", tuple(attrgetter(name) for name in self.names))

    def __call__(self, shapes: Shapes) -> int:
        if len(self.readers) == 1:
            return int(self.readers[0](shapes) or 0)
        return math.prod(int(read(shapes) or 0) for read in self.readers)

    def __mul__(self, other: "Dim") -> "Dim":
        return Dim(self.names + other.names)


def _dim(name: str) -> Dim:
    return Dim((name,))


L = _dim("seq_len")  # the queries
S = _dim("ctx_len")  # the keys (with past: P + L, the cache and the new tokens)
S_NEW = _dim("new_keys")  # the keys this request computes (with past: the L new tokens')
D_MODEL = _dim("d_model")
D_K = _dim("d_k")
D_V = _dim("d_v")
D_OUT = _dim("d_out")
H = _dim("num_heads")
H_KV = _dim("num_kv_heads")
P = _dim("past_len")  # a decode step's cached tokens
Q_LORA = _dim("latent.q_lora_rank")  # mla: the queries' latent
KV_LORA = _dim("latent.kv_lora_rank")  # mla: the keys' and values' latent
ROPE_DIM = _dim("latent.qk_rope_head_dim")  # mla: the rotated features of a query or key
NOPE_DIM = _dim("latent.qk_nope_head_dim")  # mla: the features without RoPE


@dataclass(frozen=True)
class Layout:
    """An output's shape per sequence and head, in sizes of the request, and what its first
    axis is when the explorer draws it as a table: the queries, the keys or plain indices."""

    rows: Literal["queries", "keys", "index"]
    dims: tuple[Dim | int, ...]

    def __call__(self, shapes: Shapes) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else d(shapes) for d in self.dims)


def queries(*dims: Dim | int) -> Layout:
    """A row per query: [L][dims…]."""
    return Layout("queries", (L, *dims))


def keys(*dims: Dim | int) -> Layout:
    """A row per key this request computes: [S][dims…] (with past: the new tokens')."""
    return Layout("keys", (S_NEW, *dims))


def context(*dims: Dim | int) -> Layout:
    """A row per key of the whole context, a cache's included: [P + L][dims…]."""
    return Layout("keys", (S, *dims))


def index(*dims: Dim | int) -> Layout:
    """Rows that are plain indices: [dims…]."""
    return Layout("index", dims)


def _online(s: Shapes) -> tuple[int, ...]:
    """online_softmax, per block: m, l and o for every row."""
    return (-(-s.ctx_len // (s.online_block or 1)), s.seq_len, 2 + s.d_v)


@dataclass(frozen=True)
class On:
    """Present when the variant is on (service.trace.rows.variants)."""

    variant: str

    def __call__(self, shapes: Shapes) -> bool:
        return self.variant in shapes.on


@dataclass(frozen=True)
class Generated:
    """Present when the service drew the array (x or a weight) for this request."""

    name: str

    def __call__(self, shapes: Shapes) -> bool:
        return self.name in shapes.generated


def _positional(s: Shapes) -> bool:
    return s.positional


def _q_latent(s: Shapes) -> bool:
    """mla with q_lora_rank: the queries have a latent of their own."""
    return s.latent is not None and s.latent.q_lora_rank is not None


def _past(s: Shapes) -> bool:
    return s.past_len > 0


def _masked(s: Shapes) -> bool:
    return s.masked


def _online_traced(s: Shapes) -> bool:
    return s.online_block is not None


def _residual(s: Shapes) -> bool:
    return s.residual


def _layer_norm(s: Shapes) -> bool:
    return s.layer_norm


def _warned(s: Shapes) -> bool:
    return bool(s.warnings)


def _comparing(s: Shapes) -> bool:
    return s.comparing


def _checking_decode(s: Shapes) -> bool:
    return s.check_decode


@dataclass(frozen=True)
class AnyOn:
    """Present when any of these variants is on: the positions, which several read."""

    variants: frozenset[str]

    def __call__(self, shapes: Shapes) -> bool:
        return bool(self.variants & shapes.on)


def _presence(on: str | None, when: Presence | None) -> Presence:
    """A row's presence: with a variant (``on``), by a rule (``when``), or in every response."""
    assert on is None or when is None, "a row is present on a variant or by a rule, not both"
    return On(on) if on is not None else when or _everywhere


def _view(
    title: str | None, rows_by: ShapeOf | None, heatmap: HeatMap | None, each: bool, chain: bool
) -> View | None:
    """How a row with a title is drawn; its table's rows are its layout's."""
    if title is None:
        return None
    assert isinstance(rows_by, Layout), f"{title}: a drawn output has a layout"
    return View(title, heatmap, rows_by.rows, each, chain)


# ------------------------------------------------------------ the kinds of rows, one each


def head(
    name: str,
    doc: str,
    *,
    rows_by: ShapeOf,
    kind: Kind = "matrix",
    endpoints: frozenset[Endpoint] = BOTH,
    on: str | None = None,
    when: Presence | None = None,
    title: str | None = None,
    heatmap: HeatMap | None = None,
    each_head: bool = True,
    chain: bool = False,
) -> Output:
    """An array each head computes: top level on /attention, inside ``heads[i]`` on
    /multihead; with a ``title``, drawn (for every head unless ``each_head`` is false)."""
    view = _view(title, rows_by, heatmap, each_head, chain)
    return Output(name, kind, doc, rows_by, endpoints, _presence(on, when), head=True, view=view)


def array(
    name: str,
    doc: str,
    *,
    rows_by: ShapeOf | None,
    kind: Kind = "matrix",
    endpoints: frozenset[Endpoint] = BOTH,
    on: str | None = None,
    when: Presence | None = None,
    title: str | None = None,
    heatmap: HeatMap | None = None,
    batched: bool = True,
) -> Output:
    """An array at the top of the response, one for every head (on /multihead: the block's);
    with a ``title``, drawn once."""
    view = _view(title, rows_by, heatmap, False, False)
    presence = _presence(on, when)
    return Output(name, kind, doc, rows_by, endpoints, presence, batched=batched, view=view)


def block(
    name: str,
    doc: str,
    *,
    rows_by: ShapeOf | None,
    kind: Kind = "matrix",
    on: str | None = None,
    when: Presence | None = None,
    title: str | None = None,
    heatmap: HeatMap | None = None,
) -> Output:
    """An array of /multihead's block outside its heads: its input, latents, cache, concat and
    what follows; with a ``title``, drawn once."""
    view = _view(title, rows_by, heatmap, False, False)
    return Output(name, kind, doc, rows_by, MULTIHEAD, _presence(on, when), view=view)


def value(
    name: str,
    doc: str,
    *,
    kind: Kind,
    endpoints: frozenset[Endpoint] = BOTH,
    on: str | None = None,
    when: Presence | None = None,
    always: bool = False,
) -> Output:
    """Not an array of the batch: a size, the conventions, labels, what was done and what was
    found; one for the whole request (``always``: returned whatever include says)."""
    presence = _presence(on, when)
    return Output(name, kind, doc, None, endpoints, presence, always=always, batched=False)


def drawn(name: str, doc: str, *, rows_by: Layout) -> Output:
    """An array the service generated (x, a weight), returned so the answer can be reproduced."""
    view = View(f"{name} (generated)", rows=rows_by.rows)
    return Output(name, "weight", doc, rows_by, present=Generated(name), batched=False, view=view)


_ONLINE = (
    "the softmax a block of keys at a time (with online_softmax): per block "
    '{"keys": [start, end], "m": [L], "l": [L], "o": [L][d_v]}, the running max, sum and '
    "output; the last o is output"
)

FORWARD: tuple[Output, ...] = (
    # The rows of arrays are in the order of the steps that make them: the steps' list, the
    # comparison's order and the explorer's chain of scores all follow it.
    # the multi-head block's input
    block(
        "x_in",
        "x after positional encoding (when one is applied)",
        rows_by=queries(D_MODEL),
        when=_positional,
        title="x after positional encoding",
    ),
    # one attention: top level on /attention, per head on /multihead
    head("q", "queries [L][d_k]", rows_by=queries(D_K), title="Q"),
    head("k", "keys [S][d_k] (with past: the new tokens')", rows_by=keys(D_K), title="K"),
    head("v", "values [S][d_v] (with past: the new tokens')", rows_by=keys(D_V), title="V"),
    head(
        "q_clipped",
        "Q clamped to [−clip_qkv, clip_qkv] [L][d_k] (when clip_qkv is on)",
        rows_by=queries(D_K),
        on="clip_qkv",
        title="Q clipped (clip_qkv)",
    ),
    head(
        "k_clipped",
        "K clamped to [−clip_qkv, clip_qkv] [S][d_k] (when clip_qkv is on)",
        rows_by=keys(D_K),
        on="clip_qkv",
        title="K clipped (clip_qkv)",
    ),
    head(
        "v_clipped",
        "V clamped to [−clip_qkv, clip_qkv] [S][d_v] (when clip_qkv is on)",
        rows_by=keys(D_V),
        on="clip_qkv",
        title="V clipped (clip_qkv)",
    ),
    head(
        "q_normed",
        "qk_norm(Q) [L][d_k] (when qk_norm is on)",
        rows_by=queries(D_K),
        on="qk_norm",
        title="Q after qk_norm",
    ),
    head(
        "k_normed",
        "qk_norm(K) [S][d_k] (when qk_norm is on)",
        rows_by=keys(D_K),
        on="qk_norm",
        title="K after qk_norm",
    ),
    # multi-head latent attention (DeepSeek): the latents, then each head's parts of Q and K
    block(
        "c_q",
        "the queries' latent [L][q_lora_rank], after q_a_layernorm (mla with q_lora_rank)",
        rows_by=queries(Q_LORA),
        when=_q_latent,
        title="C_q  query latent",
    ),
    block(
        "c_kv",
        "the keys' and values' latent [S][kv_lora_rank], what a cache holds with k_rope (mla)",
        rows_by=context(KV_LORA),
        on="mla",
        title="C_kv  key/value latent",
    ),
    block(
        "k_rope",
        "the rotated key features [S][qk_rope_head_dim], one per token, shared by every head (mla)",
        rows_by=context(ROPE_DIM),
        on="mla",
        title="k_rope  shared key",
    ),
    head(
        "q_nope",
        "the query features without RoPE [L][qk_nope_head_dim] (mla)",
        rows_by=queries(NOPE_DIM),
        endpoints=MULTIHEAD,
        on="mla",
        title="q_nope",
    ),
    head(
        "q_rope",
        "the rotated query features [L][qk_rope_head_dim] (mla)",
        rows_by=queries(ROPE_DIM),
        endpoints=MULTIHEAD,
        on="mla",
        title="q_rope (rotated)",
    ),
    head(
        "k_nope",
        "the key features without RoPE [S][qk_nope_head_dim] (mla)",
        rows_by=context(NOPE_DIM),
        endpoints=MULTIHEAD,
        on="mla",
        title="k_nope",
    ),
    head(
        "q_rotated",
        "RoPE(Q) [L][d_k], what the scores use (when rope is on)",
        rows_by=queries(D_K),
        on="rope",
        title="Q rotated (RoPE)",
    ),
    head(
        "k_rotated",
        "RoPE(K) [S][d_k] (when rope is on)",
        rows_by=keys(D_K),
        on="rope",
        title="K rotated (RoPE)",
    ),
    head(
        "q_tempered",
        "the queries times their temperature [L][d_k] (when temperature is on)",
        rows_by=queries(D_K),
        on="temperature",
        title="Q × temperature",
    ),
    head(
        "v_normed",
        "rms_norm(V) [S][d_v], what the output uses (when v_norm is on)",
        rows_by=keys(D_V),
        on="v_norm",
        title="V after v_norm",
    ),
    # a decode step's cache after this step: the cached keys, then the new ones normed and rotated
    array(
        "present_k",
        "the cache's keys after this step [P + L][d_k]: past.k then the new tokens' (with past)",
        rows_by=context(D_K),
        endpoints=ATTENTION,
        when=_past,
    ),
    array(
        "present_v",
        "the cache's values after this step [P + L][d_v]: past.v then the new tokens' (with past)",
        rows_by=context(D_V),
        endpoints=ATTENTION,
        when=_past,
    ),
    block(
        "present_k",
        "the cache's keys after this step [h_kv][P + L][d_k]: past.k then the new tokens' (with past)",
        rows_by=index(H_KV, S, D_K),
        kind="stack",
        when=_past,
    ),
    block(
        "present_v",
        "the cache's values after this step [h_kv][P + L][d_v]: past.v then the new tokens' (with past)",
        rows_by=index(H_KV, S, D_V),
        kind="stack",
        when=_past,
    ),
    head(
        "scores",
        "Q Kᵀ [L][S]",
        rows_by=queries(S),
        title="scores  Q Kᵀ",
        heatmap="scores",
        each_head=False,
    ),
    head(
        "scaled_scores",
        "Q Kᵀ · scale [L][S]",
        rows_by=queries(S),
        title="scaled scores",
        heatmap="scores",
        chain=True,
    ),
    head(
        "capped_scores",
        "c · tanh(scaled_scores / c) [L][S] (when softcap is on)",
        rows_by=queries(S),
        on="softcap",
        title="capped scores  c·tanh(s/c)",
        heatmap="scores",
        chain=True,
    ),
    head(
        "position_bias",
        "the ALiBi or T5 bias [L][S] (when one is on)",
        rows_by=queries(S),
        on="position_bias",
        title="position bias",
        heatmap="scores",
    ),
    head(
        "biased_scores",
        "the scores so far plus position_bias [L][S]",
        rows_by=queries(S),
        on="position_bias",
        title="scores + position bias",
        heatmap="scores",
        chain=True,
    ),
    # the combined mask: top level (one for every head), made before it is added
    array(
        "mask",
        "the combined mask [L][S], true = may attend",
        rows_by=queries(S),
        kind="bool",
        when=_masked,
        title="mask (1 = may attend)",
        heatmap="mask",
    ),
    array(
        "additive_mask",
        "0 where allowed, null (−∞) where masked, plus additive values",
        rows_by=queries(S),
        kind="nullable",
        when=_masked,
    ),
    head(
        "masked_scores",
        "the scores so far plus the mask; null where masked (only when a mask applies)",
        rows_by=queries(S),
        kind="nullable",
        when=_masked,
        title="masked scores",
        heatmap="scores",
        chain=True,
    ),
    head(
        "sink_weights",
        "the weight each query row gives the sink [L] (when sinks are on); its weights sum to 1 − this",
        rows_by=queries(),
        kind="vector",
        on="sinks",
    ),
    head(
        "weights",
        "row softmax of the final scores [L][S]",
        rows_by=queries(S),
        title="weights  softmax",
        heatmap="weights",
    ),
    # FlashAttention's computation of the same weights V, a block of keys at a time
    array(
        "online_softmax",
        _ONLINE,
        rows_by=_online,
        kind="blocks",
        endpoints=ATTENTION,
        when=_online_traced,
        batched=False,
    ),  # the batch inside
    head(
        "online_softmax",
        _ONLINE,
        rows_by=_online,
        kind="blocks",
        endpoints=MULTIHEAD,
        when=_online_traced,
    ),
    head("output", "weights V [L][d_v]", rows_by=queries(D_V), title="output", each_head=False),
    # the multi-head block
    block(
        "average_weights",
        "mean of the heads' weights (nn.MultiheadAttention average_attn_weights=True)",
        rows_by=queries(S),
        title="average weights (all heads)",
        heatmap="weights",
    ),
    block(
        "weights",
        "every head's weights stacked [h][L][S] (nn.MultiheadAttention average_attn_weights=False)",
        rows_by=index(H, L, S),
        kind="stack",
    ),
    block("heads", "h per-head traces", rows_by=None, kind="heads"),
    block(
        "concat",
        "the heads' outputs side by side [L][h·d_v]",
        rows_by=queries(H * D_V),
        title="concat",
    ),
    block(
        "gate",
        "sigmoid(x W_gᵀ + b_g) [L][h·d_v] (when gate is on)",
        rows_by=queries(H * D_V),
        on="gate",
        title="gate  sigmoid(x W_gᵀ)",
    ),
    block(
        "gated",
        "concat · gate [L][h·d_v] (when gate is on)",
        rows_by=queries(H * D_V),
        on="gate",
        title="gated concat",
    ),
    block(
        "projected",
        "(gated) concat W_o + b_o [L][d_out]",
        rows_by=queries(D_OUT),
        title="concat · W_o",
    ),
    block(
        "residual",
        "x_in + projected (when asked)",
        rows_by=queries(D_OUT),
        when=_residual,
        title="residual",
    ),
    block(
        "layer_norm",
        "layer norm of the residual, or of projected (when asked)",
        rows_by=queries(D_OUT),
        when=_layer_norm,
        title="layer norm",
    ),
    block(
        "output",
        "the final result: the last of projected, residual, layer_norm",
        rows_by=queries(D_OUT),
        title="output",
    ),
    # the numbers the position variants used, so a cell can be explained from the answer (few:
    # returned whatever include says)
    value(
        "query_positions",
        "the queries' positions [L] that RoPE, the position bias and the temperature used: "
        "positions as given, else 0 … L−1 (with past: P … P + L − 1); linear scaling divides "
        "them before the angles, which take p / factor",
        kind="integers",
        when=AnyOn(frozenset({"rope", "temperature", "position_bias"})),
        always=True,
    ),
    value(
        "key_positions",
        "the keys' positions [S] that RoPE and the position bias used: context_positions as "
        "given; in self-attention the queries' positions; else 0 … S−1 (with past: the cache's "
        "0 … P − 1, then the new tokens' at the queries' positions)",
        kind="integers",
        when=AnyOn(frozenset({"rope", "position_bias"})),
        always=True,
    ),
    value(
        "rope_frequencies",
        "θ_i [r/2] as the rotation used them, after the scaling, for the queries' sequence length "
        "(n = the largest query position + 1); [d_k/2] with the proportional style (0: a pair "
        "left unturned); [qk_rope_head_dim/2] with mla (when rope is on)",
        kind="numbers",
        on="rope",
        always=True,
    ),
    value(
        "rope_gain",
        "the factor multiplying cos and sin: the scaling's attention factor, 1 without one (when "
        "rope is on)",
        kind="float",
        on="rope",
        always=True,
    ),
    value(
        "alibi_slopes",
        "each head's ALiBi slope [h] (given, or the paper's) (when alibi is on)",
        kind="numbers",
        on="alibi",
        always=True,
    ),
    # sizes and conventions, always returned
    value("scale", "the factor applied to Q Kᵀ", kind="float", always=True),
    value("num_heads", "h", kind="int", endpoints=MULTIHEAD, always=True),
    value(
        "num_kv_heads",
        "key/value heads (h unless grouped-query attention)",
        kind="int",
        endpoints=MULTIHEAD,
        always=True,
    ),
    value(
        "mla_cache_numbers",
        "what a cache holds per token with mla: kv_lora_rank + qk_rope_head_dim (against h·(d_k + d_v) without)",
        kind="int",
        endpoints=MULTIHEAD,
        on="mla",
    ),
    value("d_k", "width of queries and keys (per head in /multihead)", kind="int", always=True),
    value("d_v", "width of values (per head in /multihead)", kind="int", always=True),
    value("tokens", "labels of the L queries, when known", kind="labels"),
    value("context_tokens", "labels of the S keys, when known", kind="labels"),
    value(
        "conventions",
        "the conventions this answer was computed with",
        kind="conventions",
        always=True,
    ),
    # for reading
    array(
        "summary",
        "per query row: top key, its weight and the entropy (per batch item when batched; over average_weights in /multihead)",
        rows_by=queries(3),
        kind="summary",
    ),
    value("steps", "every operation performed, in order", kind="steps"),
    value(
        "warnings",
        "what looks wrong without expected numbers, e.g. a boolean mask whose polarity looks inverted (only when there is something)",
        kind="warnings",
        when=_warned,
        always=True,
    ),
    # compare with your numbers (when expected is given)
    value(
        "comparison",
        "your expected arrays against the service's, in the order of the steps: whether each matches, the largest difference and where, and for the first difference the mistake that reproduces it",
        kind="comparison",
        when=_comparing,
        always=True,
    ),
    value(
        "decode_check",
        "the sequence at once against a token at a time with a growing cache: {max_abs_diff, steps} (with check_decode)",
        kind="check",
        when=_checking_decode,
        always=True,
    ),
    value(
        "first_mismatch",
        "the earliest compared name that differs, or null",
        kind="name",
        when=_comparing,
        always=True,
    ),
    # the mask's consequence
    array(
        "fully_masked_rows",
        "query rows with no key allowed (per batch item when batched)",
        rows_by=None,
        kind="rows",
        when=_masked,
    ),
    # generated arrays, so the user can reproduce them
    drawn("x", "generated x [L][d_model], when it was generated", rows_by=index(L, D_MODEL)),
    drawn("w_q", "generated w_q (in_out), when generated", rows_by=index(D_MODEL, H * D_K)),
    drawn("w_k", "generated w_k (in_out), when generated", rows_by=index(D_MODEL, H_KV * D_K)),
    drawn("w_v", "generated w_v (in_out), when generated", rows_by=index(D_MODEL, H_KV * D_V)),
)
