"""The compute endpoints (and /model) with their fields, written once for both clients.

``_Endpoints[R]`` holds the typed methods; a client supplies ``_post``, which returns a
``Result`` (``Client``) or a coroutine of one (``AsyncClient``).
"""

from collections.abc import Mapping, Sequence
from typing import Any, Generic, Literal, TypeAlias, TypeVar

R = TypeVar("R")

ArrayLike: TypeAlias = Any
"""A NumPy array, a nested list of numbers, or a torch tensor."""
MaskLike: TypeAlias = Any
"""A mask object (``{"type": "causal"}``, ``masks.boolean(m)`` …), a list of them, or a bare
matrix (boolean: a boolean mask; numbers: an additive one)."""
Layout: TypeAlias = Literal["in_out", "out_in"]
Policy: TypeAlias = Literal["zero", "uniform", "error"]
GradLike: TypeAlias = Any
"""∂loss/∂(the answer's last array), shaped as it (an array, as ``x`` is taken), or ``"sum"``
(every entry 1: the gradient of that array's sum)."""


def _fields(scope: dict[str, Any]) -> dict[str, Any]:
    """A method's arguments as request fields: None means "not sent"; ``extra`` adds its own."""
    extra = scope["extra"]
    fields = {k: v for k, v in scope.items() if k not in ("self", "extra") and v is not None}
    for name, value in extra.items():
        if name in fields:
            raise TypeError(f"{name} given twice")
        fields[name] = value
    return fields


NO_CONFIG = (
    "layer(module, config, x) takes a transformers attention module and its config (a "
    "PretrainedConfig or the config.json dict); got {got}. A module without a config "
    "(torch.nn.MultiheadAttention, your own) goes by its weights and its heads: "
    "client.multihead(x=x, num_heads=h, state_dict=module.state_dict())"
)


def _config(module: object, config: object) -> dict[str, Any]:
    """``config`` as the dict the service reads: a ``PretrainedConfig``'s ``to_dict()`` or a
    mapping as it is; ``None``: the module's own ``config``. Anything else: a TypeError."""
    given = config if config is not None else getattr(module, "config", None)
    as_dict = getattr(given, "to_dict", None)
    if callable(as_dict):
        return dict(as_dict())
    if isinstance(given, Mapping):
        return dict(given)
    if config is None:
        got = f"None, and the {type(module).__name__} module keeps no config of its own"
    else:
        got = f"a {type(config).__name__}"
    raise TypeError(NO_CONFIG.format(got=got))


def _state_dict(value: object) -> Mapping[str, Any]:
    """``state_dict`` as given, when it is a mapping of names to arrays; a module (torch's or
    anything with a ``state_dict()`` method) is refused with the call that gives its weights."""
    if isinstance(value, Mapping):
        return value
    kind = type(value).__name__
    if callable(getattr(value, "state_dict", None)):
        raise TypeError(
            f"state_dict takes the module's weights, not the module: pass "
            f"state_dict=module.state_dict() (got the {kind} module itself)"
        )
    raise TypeError(
        f"state_dict must be a mapping of names to arrays, such as module.state_dict(); got {kind}"
    )


class _Endpoints(Generic[R]):
    """``attention``, ``mask`` and ``multihead``; subclasses send the request (``_post``)."""

    def _post(self, path: str, fields: dict[str, Any]) -> R:
        raise NotImplementedError

    def attention(
        self,
        *,
        x: ArrayLike = None,
        context: ArrayLike = None,
        w_q: ArrayLike = None,
        w_k: ArrayLike = None,
        w_v: ArrayLike = None,
        b_q: ArrayLike = None,
        b_k: ArrayLike = None,
        b_v: ArrayLike = None,
        q: ArrayLike = None,
        k: ArrayLike = None,
        v: ArrayLike = None,
        tokens: Sequence[str] | None = None,
        sentence: str | None = None,
        context_tokens: Sequence[str] | None = None,
        seed: int | None = None,
        init: Literal["uniform", "normal"] | None = None,
        d_model: int | None = None,
        d_k: int | None = None,
        d_v: int | None = None,
        seq_len: int | None = None,
        weight_layout: Layout | None = None,
        scale: float | None = None,
        mask: MaskLike = None,
        key_padding_mask: ArrayLike = None,
        fully_masked_rows: Policy | None = None,
        qk_norm: bool | Mapping[str, Any] | None = None,
        rope: bool | Mapping[str, Any] | None = None,
        softcap: float | None = None,
        alibi: bool | Mapping[str, Any] | None = None,
        relative_bias: Mapping[str, Any] | None = None,
        sinks: float | ArrayLike | None = None,
        positions: ArrayLike = None,
        context_positions: ArrayLike = None,
        include: Sequence[str] | None = None,
        decimals: int | None = None,
        expected: Mapping[str, Any] | None = None,
        tolerance: Mapping[str, float] | None = None,
        grad_output: GradLike = None,
        **extra: Any,
    ) -> R:
        """``POST /attention``: scaled dot-product attention, every step.

        Give Q, K and V one way: ``x`` with ``w_q``, ``w_k``, ``w_v`` (``context`` for
        cross-attention; ``weight_layout="out_in"`` for PyTorch weights), or ``q``, ``k``,
        ``v`` directly, or let the service draw what is missing from ``seed``. Arrays may be
        NumPy arrays, nested lists or torch tensors. Every argument left at None is not sent;
        ``extra`` takes any other field of the API by its name. docs/api.md describes them all.

        ``grad_output`` adds the backward pass: ∂loss/∂output, shaped as ``output`` (an array,
        as ``x`` is taken), or ``"sum"`` (every entry 1, as ``out.sum().backward()``). The
        answer then also holds the gradient of every array it reaches, named ``grad_`` + that
        array's name (``result.grad_weights``, ``result["grad_q"]``, ``result.gradients``) with
        a step each after the forward's; ``expected`` takes your ``grad_*`` arrays too.

        Returns a :class:`~attention_client.Result` (``result.weights``, ``result.output``,
        ``result.steps`` …); raises :class:`~attention_client.ServiceError` on an error answer.
        """
        return self._post("/attention", _fields(locals()))

    def mask(
        self,
        *,
        mask: MaskLike = None,
        x: ArrayLike = None,
        context: ArrayLike = None,
        w_q: ArrayLike = None,
        w_k: ArrayLike = None,
        w_v: ArrayLike = None,
        b_q: ArrayLike = None,
        b_k: ArrayLike = None,
        b_v: ArrayLike = None,
        q: ArrayLike = None,
        k: ArrayLike = None,
        v: ArrayLike = None,
        tokens: Sequence[str] | None = None,
        sentence: str | None = None,
        context_tokens: Sequence[str] | None = None,
        seed: int | None = None,
        init: Literal["uniform", "normal"] | None = None,
        d_model: int | None = None,
        d_k: int | None = None,
        d_v: int | None = None,
        seq_len: int | None = None,
        weight_layout: Layout | None = None,
        scale: float | None = None,
        key_padding_mask: ArrayLike = None,
        fully_masked_rows: Policy | None = None,
        qk_norm: bool | Mapping[str, Any] | None = None,
        rope: bool | Mapping[str, Any] | None = None,
        softcap: float | None = None,
        alibi: bool | Mapping[str, Any] | None = None,
        relative_bias: Mapping[str, Any] | None = None,
        sinks: float | ArrayLike | None = None,
        positions: ArrayLike = None,
        context_positions: ArrayLike = None,
        include: Sequence[str] | None = None,
        decimals: int | None = None,
        expected: Mapping[str, Any] | None = None,
        tolerance: Mapping[str, float] | None = None,
        grad_output: GradLike = None,
        **extra: Any,
    ) -> R:
        """``POST /mask``: attention with a required mask (``mask``, ``key_padding_mask`` or
        both); the answer adds ``mask``,
        ``additive_mask``, ``masked_scores`` (−∞ where hidden) and ``fully_masked_rows``.

        ``mask`` is a mask object (``{"type": "causal"}``; see :mod:`attention_client.masks`),
        a list of them (combined with AND), or a bare matrix. The other arguments are those of
        :meth:`attention`, ``grad_output`` included (shaped as ``output``; a masked cell's
        ``grad_masked_scores`` is 0).
        """
        return self._post("/mask", _fields(locals()))

    def multihead(
        self,
        *,
        x: ArrayLike = None,
        num_heads: int | None = None,
        num_kv_heads: int | None = None,
        context: ArrayLike = None,
        w_q: ArrayLike = None,
        w_k: ArrayLike = None,
        w_v: ArrayLike = None,
        b_q: ArrayLike = None,
        b_k: ArrayLike = None,
        b_v: ArrayLike = None,
        in_proj_weight: ArrayLike = None,
        in_proj_bias: ArrayLike = None,
        heads: Sequence[Mapping[str, Any]] | None = None,
        w_o: ArrayLike = None,
        b_o: ArrayLike = None,
        out_proj_weight: ArrayLike = None,
        out_proj_bias: ArrayLike = None,
        state_dict: Mapping[str, Any] | None = None,
        q: ArrayLike = None,
        k: ArrayLike = None,
        v: ArrayLike = None,
        tokens: Sequence[str] | None = None,
        sentence: str | None = None,
        context_tokens: Sequence[str] | None = None,
        seed: int | None = None,
        init: Literal["uniform", "normal"] | None = None,
        d_model: int | None = None,
        d_k: int | None = None,
        d_v: int | None = None,
        seq_len: int | None = None,
        weight_layout: Layout | None = None,
        scale: float | None = None,
        positional_encoding: str | ArrayLike | None = None,
        residual: bool | None = None,
        layer_norm: bool | Mapping[str, Any] | None = None,
        mask: MaskLike = None,
        key_padding_mask: ArrayLike = None,
        fully_masked_rows: Policy | None = None,
        qk_norm: bool | Mapping[str, Any] | None = None,
        rope: bool | Mapping[str, Any] | None = None,
        softcap: float | None = None,
        alibi: bool | Mapping[str, Any] | None = None,
        relative_bias: Mapping[str, Any] | None = None,
        sinks: ArrayLike = None,
        positions: ArrayLike = None,
        context_positions: ArrayLike = None,
        include: Sequence[str] | None = None,
        decimals: int | None = None,
        expected: Mapping[str, Any] | None = None,
        tolerance: Mapping[str, float] | None = None,
        grad_output: GradLike = None,
        **extra: Any,
    ) -> R:
        """``POST /multihead``: multi-head attention, per-head traces, output projection,
        residual and layer norm.

        The projections come in one of four forms: ``w_q``/``w_k``/``w_v`` (split into
        ``num_heads`` heads), PyTorch's packed ``in_proj_weight``, per-head ``heads``, or a
        module's ``state_dict`` — ``nn.MultiheadAttention``'s (``in_proj_weight``,
        ``out_proj.weight`` …) or a Hugging Face attention module's (``q_proj.weight``,
        ``o_proj.weight``, ``q_norm.weight``, ``sinks`` …), whose entries are sent under their
        own names. The other arguments are those of :meth:`attention`; ``result.heads[i]``
        holds head i's arrays, ``result.weights`` the stacked ``[h][L][S]`` weights.

        ``grad_output`` is shaped as the layer's last array (``layer_norm``, ``residual`` or
        ``projected``; ``concat`` for heads given without W_o), or ``"sum"``. The gradients
        come where their arrays are: each head's in ``result.heads[i]``
        (``result["heads.0.grad_weights"]``), the block's and the weights' at the top
        (``grad_x``, ``grad_w_q`` in the request's layout, ``grad_w_o``, ``grad_ln_gamma`` …;
        ``grad_state_dict`` under a state dict's own names).
        """
        fields = _fields(locals())
        for name, value in _state_dict(fields.pop("state_dict", {})).items():
            if name in fields:
                raise TypeError(f"{name} given both in state_dict and as an argument")
            fields[name] = value
        return self._post("/multihead", fields)

    def layer(
        self,
        module: Any,
        config: Any,
        x: ArrayLike,
        *,
        layer: int | None = None,
        **extra: Any,
    ) -> R:
        """``POST /multihead`` for a transformers attention module as it is: its
        ``state_dict()`` under its own names and its ``config`` (a ``PretrainedConfig`` or the
        config.json dict), from which the service takes the heads, RoPE and its scaling, the
        window, softcap, norms … of ``layer`` (default: the module's ``layer_idx``, else 0).
        ``extra`` adds request fields (``past``, ``check_decode``, ``expected`` …); the
        answer's ``conventions["config"]`` says which config key gave each field::

            r = client.layer(model.model.layers[0].self_attn, model.config, x)
            assert abs(r.output - out.detach().numpy()).max() < 1e-6  # float32 inside HF

        ``config=None`` takes the module's own ``config`` (transformers modules keep the one
        they were built with); a module without one (``torch.nn.MultiheadAttention``, your own)
        is a ``TypeError`` saying to send its weights with ``multihead(state_dict=…)``.
        """
        return self.multihead(
            x=x,
            state_dict=module.state_dict(),
            config=_config(module, config),
            layer=layer if layer is not None else getattr(module, "layer_idx", None) or 0,
            **extra,
        )

    def model(
        self,
        text: str,
        *,
        model: str = "minilm",
        layer: int | None = None,
        include: Sequence[str] | None = None,
        decimals: int | None = None,
        expected: Mapping[str, Any] | None = None,
        tolerance: Mapping[str, float] | None = None,
        grad_output: GradLike = None,
    ) -> R:
        """``POST /model``: a trained model (``GET /models`` lists them) on your ``text``.

        ``result["tokens"]`` are the model tokenizer's tokens, ``result.attention`` every layer's
        and head's weights ``[layers][heads][L][L]``, ``result.rollout`` the attention rollout
        ``[L][L]``, ``result["head_roles"][layer][head]`` each head's scores and role, and the
        chosen ``layer``'s whole /multihead trace under ``trace.``: ``result["trace.x_in"]``,
        ``result["trace.heads.0.weights"]``, ``result["trace.output"]``. ``expected`` holds
        your arrays of that layer, named as /multihead names them. ``grad_output`` (∂loss/∂ the
        layer's output ``[L][d_model]``, or ``"sum"``) adds the layer's backward pass to the
        trace: ``result["trace.grad_x"]``, ``result["trace.heads.0.grad_weights"]`` …
        """
        fields = {k: v for k, v in locals().items() if k != "self" and v is not None}
        return self._post("/model", fields)
