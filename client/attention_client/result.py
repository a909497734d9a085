"""What a compute endpoint answered: NumPy arrays by name, and the rest as JSON."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy.typing as npt

from attention_client.display import result_html, short_repr
from attention_client.model_view import Normalise, is_model_answer, model_html, trace_arrays
from attention_client.wire import rebuild


def _missing(kind: str, name: str, names: list[str]) -> AttributeError:
    """The error for an output that is not there, naming those that are."""
    shown = ", ".join(sorted(names)) or "none"
    return AttributeError(f"{kind} has no output {name!r}; its outputs are: {shown}")


def _gradients(arrays: Mapping[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
    """The backward's arrays at this level (``grad_q``, ``row_dot``,
    ``grad_state_dict.q_proj.weight`` …; not a head's), in the answer's order."""
    return {n: a for n, a in arrays.items() if n.startswith("grad_") or n == "row_dot"}


def _arrays_of(obj: object) -> Mapping[str, npt.NDArray[Any]]:
    """``obj.arrays`` without going through ``__getattr__`` (copy and pickle look attributes up
    before the fields exist)."""
    arrays: Mapping[str, npt.NDArray[Any]] = obj.__dict__.get("arrays", {})
    return arrays


@dataclass(frozen=True)
class HTMLView:
    """HTML that Jupyter draws (``_repr_html_``); ``str()`` gives it."""

    html: str

    def _repr_html_(self) -> str:
        return self.html

    def __str__(self) -> str:
        return self.html


@dataclass(frozen=True)
class Head:
    """One head of a ``/multihead`` answer: ``head.weights``, ``head.q``, ``head["scores"]``…"""

    arrays: Mapping[str, npt.NDArray[Any]]
    json: Mapping[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> npt.NDArray[Any]:
        arrays = _arrays_of(self)
        if name.startswith("_") or name not in arrays:
            raise _missing("this head", name, list(arrays))
        return arrays[name]

    def __getitem__(self, name: str) -> Any:
        return self.arrays[name] if name in self.arrays else self.json[name]

    @property
    def gradients(self) -> dict[str, npt.NDArray[Any]]:
        """This head's backward (``grad_weights``, ``row_dot``, ``grad_q`` …) when the request
        had ``grad_output``; empty otherwise."""
        return _gradients(self.arrays)

    def __repr__(self) -> str:
        return short_repr(self.arrays, self.json, "Head")

    def _repr_html_(self) -> str:
        """Jupyter's rich display: this head's maps as heatmaps."""
        return result_html(self.arrays, self.json, "Head")


@dataclass(frozen=True)
class Result:
    """An answer of ``/attention``, ``/mask`` or ``/multihead``, the same in JSON and safetensors.

    Arrays are NumPy arrays (float64; ``mask`` boolean; −∞ where a score is masked):
    ``result.weights``, ``result["scores"]``, ``result.heads[0].weights``. ``arrays`` holds them
    all by their dotted path (``"heads.0.weights"``), ``json`` everything else, as sent (the
    per-head entries without their arrays). ``summary``, ``steps``, ``conventions``, ``scale``,
    ``comparison``, ``first_mismatch``, ``warnings`` read ``json`` (None when absent);
    ``to_dict()`` is the whole answer as one nested dict.
    """

    arrays: Mapping[str, npt.NDArray[Any]]
    json: Mapping[str, Any]
    request_id: str | None = None

    def __getattr__(self, name: str) -> npt.NDArray[Any]:
        arrays = _arrays_of(self)
        if name.startswith("_") or name not in arrays:
            raise _missing("the result", name, self._top_names() if arrays else [])
        return arrays[name]

    def __getitem__(self, name: str) -> Any:
        """An array by name or dotted path, ``"heads"``, or any other field of the answer."""
        if name in self.arrays:
            return self.arrays[name]
        if name == "heads" and self.heads:
            return self.heads
        return self.json[name]

    def __contains__(self, name: object) -> bool:
        return name in self.arrays or name in self.json

    def _top_names(self) -> list[str]:
        """The names at the top of the answer: its arrays and its other fields."""
        return sorted({n.split(".")[0] for n in self.arrays} | set(self.json))

    @cached_property
    def heads(self) -> tuple[Head, ...]:
        """The per-head traces of ``/multihead`` (empty elsewhere, or when not included)."""
        entries = self.json.get("heads")
        if not isinstance(entries, list):
            return ()
        heads = []
        for i, entry in enumerate(entries):
            prefix = f"heads.{i}."
            own = {n[len(prefix) :]: a for n, a in self.arrays.items() if n.startswith(prefix)}
            heads.append(Head(own, entry if isinstance(entry, dict) else {}))
        return tuple(heads)

    @property
    def gradients(self) -> dict[str, npt.NDArray[Any]]:
        """With ``grad_output``: the backward's arrays at the top of the answer by name, the
        ``grad_*`` and D (``row_dot``): ``grad_output``, ``grad_weights`` … ``grad_q``; on
        ``/multihead`` the block's and the weights' (each head's are in
        ``heads[i].gradients``). Empty without it. ``steps`` lists them in the order the
        backward makes them."""
        return _gradients(self.arrays)

    @property
    def grad_state_dict(self) -> dict[str, npt.NDArray[Any]] | None:
        """On ``/multihead`` with ``grad_output``, when the weights were given as a state dict
        (or ``in_proj_weight``, ``heads``): each parameter's gradient under the name it was
        given (``"in_proj_weight"``, ``"q_proj.weight"``), shaped as given, as
        ``module.state_dict()`` holds them; None otherwise."""
        prefix = "grad_state_dict."
        found = {n[len(prefix) :]: a for n, a in self.arrays.items() if n.startswith(prefix)}
        return found or None

    @cached_property
    def trace(self) -> "Result | None":
        """On ``/model``: the traced layer's ``/multihead`` answer as a Result of its own
        (``result.trace.heads[3]`` draws that head large); None when not included."""
        info = self.json.get("trace")
        if not isinstance(info, Mapping):
            return None
        return Result(trace_arrays(self.arrays), info, self.request_id)

    @property
    def scale(self) -> float | None:
        """The scale applied to ``Q Kᵀ``."""
        value = self.json.get("scale")
        return None if value is None else float(value)

    @property
    def d_k(self) -> int | None:
        """The width of queries and keys (per head on ``/multihead``)."""
        return self.json.get("d_k")

    @property
    def d_v(self) -> int | None:
        """The width of values (per head on ``/multihead``)."""
        return self.json.get("d_v")

    @property
    def num_heads(self) -> int | None:
        """h, on ``/multihead``."""
        return self.json.get("num_heads")

    @property
    def num_kv_heads(self) -> int | None:
        """h_kv, on ``/multihead``."""
        return self.json.get("num_kv_heads")

    @property
    def tokens(self) -> list[str] | None:
        """The queries' labels, when known."""
        return self.json.get("tokens")

    @property
    def context_tokens(self) -> list[str] | None:
        """The keys' labels, when known."""
        return self.json.get("context_tokens")

    @property
    def fully_masked_rows(self) -> list[Any] | None:
        """With a mask: the rows whose every key is hidden (one list per item when batched)."""
        return self.json.get("fully_masked_rows")

    @property
    def conventions(self) -> dict[str, Any] | None:
        """The conventions the service applied (weight layout, mask polarity, …)."""
        return self.json.get("conventions")

    @property
    def summary(self) -> list[Any] | None:
        """One row per query: top key, its weight, entropy (one list per item when batched)."""
        return self.json.get("summary")

    @property
    def steps(self) -> list[dict[str, Any]] | None:
        """The operations in order, each ``{"name", "formula", "shape"}``."""
        return self.json.get("steps")

    @property
    def comparison(self) -> list[dict[str, Any]] | None:
        """With ``expected``: one entry per array compared, in the order of the steps."""
        return self.json.get("comparison")

    @property
    def first_mismatch(self) -> str | None:
        """With ``expected``: the earliest compared array that differs, or None."""
        return self.json.get("first_mismatch")

    @property
    def warnings(self) -> list[dict[str, Any]] | None:
        """What looked wrong in the request (a mask's polarity), when anything did."""
        return self.json.get("warnings")

    def __repr__(self) -> str:
        """One line: the sizes, the arrays there are, the tokens and the comparison's verdict."""
        return short_repr(self.arrays, self.json)

    def _repr_html_(self) -> str:
        """Jupyter's rich display: the comparison with your numbers (when the request had
        ``expected``) with its diagnosis, then every L×S map (scores … weights; on
        ``/multihead`` the average and each head's weights) as a heatmap, queries down and
        keys across, values printed in the cells of maps up to 16 tokens; with ``grad_output``,
        a backward section: the check of your gradients and each gradient map (dP, dS) beside
        its forward map. A ``/model`` answer
        draws the model view instead (:meth:`model_view`, rows normalised)."""
        if is_model_answer(self.arrays, self.json):
            return model_html(self.arrays, self.json)
        return result_html(self.arrays, self.json)

    def model_view(self, normalise: Normalise = "rows") -> "HTMLView":
        """A ``/model`` answer's view (:mod:`attention_client.model_view`): the summary of the
        heads that matter, the layers × heads grid, the rollout and the traced layer, each map
        normalised by ``"rows"`` (each row by its largest weight), ``"heads"`` (each map by its
        largest) or ``"none"``. Jupyter draws it; ``str(view)`` is its HTML."""
        return HTMLView(model_html(self.arrays, self.json, normalise))

    def to_dict(self) -> dict[str, Any]:
        """The whole answer as one nested dict, arrays (NumPy) put back at their place."""
        return rebuild(self.arrays, self.json)
