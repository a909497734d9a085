"""Compare works on an MLA layer's gradients, through the API (API.md, "The backward pass,
every step"; docs/api.md 2.7 "Gradients"): DeepSeek's attention (transformers'
``DeepseekV3Attention``, built as tests/api/test_backward_mla.py builds it, its state dict under
DeepSeek's names) posted with ``grad_output`` and the learner's gradients in ``expected``. The
learner's backward is tests/core/test_latent_diagnosis.py's NumPy by hand, checked here first
against torch.autograd of the layer itself; with each of the contract's backward mistakes put in,
the first wrong gradient (grad_x, a grad_state_dict entry, a head's grad_q, grad_c_kv,
grad_k_rope) is named with that mistake, or pair; right gradients are never diagnosed, and a
difference no listed mistake makes is said so."""

from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from tests.api.test_backward_mla import _autograd
from tests.core.test_backward_mistakes import Bugs
from tests.core.test_latent_diagnosis import Layer, by_hand

pytestmark = pytest.mark.torch
Array = np.ndarray[Any, np.dtype[np.float64]]
H, NOPE, D_V = 2, 4, 6  # test_backward_mla's configs


def post(client: TestClient, body: dict[str, Any]) -> Any:
    r = client.post("/multihead", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _in_out(sd: dict[str, Any], name: str) -> Array | None:
    return None if name not in sd else np.asarray(sd[name]).T


def _vec(sd: dict[str, Any], name: str) -> Array | None:
    return None if name not in sd else np.asarray(sd[name])


def learner(case: str, seed: int = 3) -> tuple[dict[str, Any], Layer, Array, dict[str, Any]]:
    """The request (no include), the learner's layer in in_out, dY (B, L, d), autograd's."""
    body, theirs, _ = _autograd(case, np.random.default_rng(seed))
    body.pop("include")
    x = np.asarray(body["x"], dtype=np.float64)
    d_y = np.asarray(body["grad_output"], dtype=np.float64)
    if x.ndim == 2:
        x, d_y = x[None], d_y[None]
    q_lora = "q_a_proj.weight" in body
    w_q = _in_out(body, "q_b_proj.weight" if q_lora else "q_proj.weight")
    w_kv_a, w_kv_b = _in_out(body, "kv_a_proj_with_mqa.weight"), _in_out(body, "kv_b_proj.weight")
    kv_norm, w_o = _vec(body, "kv_a_layernorm.weight"), _in_out(body, "o_proj.weight")
    assert w_q is not None and w_kv_a is not None and w_kv_b is not None
    assert kv_norm is not None and w_o is not None
    layer = Layer(
        x=x, w_q=w_q, w_kv_a=w_kv_a, kv_norm=kv_norm, w_kv_b=w_kv_b, w_o=w_o, h=H, nope=NOPE,
        rope=body["mla"]["qk_rope_head_dim"], d_v=D_V,
        interleave=body["rope"]["style"] == "interleaved",
        w_q_a=_in_out(body, "q_a_proj.weight"), q_norm=_vec(body, "q_a_layernorm.weight"),
        b_q_a=_vec(body, "q_a_proj.bias"), b_kv_a=_vec(body, "kv_a_proj_with_mqa.bias"),
        b_o=_vec(body, "o_proj.bias"),
    )  # fmt: skip
    return body, layer, d_y, theirs


# what the answer names each of the learner's gradients by: (where, how it is read off)
STATE_DICT = {
    "q_a_proj.weight": "grad_w_q_a", "q_b_proj.weight": "grad_w_q", "q_proj.weight": "grad_w_q",
    "kv_a_proj_with_mqa.weight": "grad_w_kv_a", "kv_b_proj.weight": "grad_w_kv_b",
    "kv_a_proj_with_mqa.bias": "grad_b_kv_a", "kv_a_layernorm.weight": "grad_kv_a_norm_weight",
    "q_a_layernorm.weight": "grad_q_a_norm_weight", "q_a_proj.bias": "grad_b_q_a",
}  # fmt: skip


def expected(
    mine: dict[str, Array], body: dict[str, Any], names: tuple[str, ...]
) -> dict[str, Any]:
    """The learner's arrays as ``expected`` takes them: top level, ``heads.<i>.grad_q`` per
    head, ``grad_state_dict.<name>`` out_in; unbatched as the body is."""
    one = np.asarray(body["x"]).ndim == 2
    out: dict[str, Any] = {}
    for name in names:
        if name.startswith("heads."):
            _, i, grad = name.split(".")
            a = mine[grad][:, int(i)]
            heads = out.setdefault("heads", [{} for _ in range(H)])
            heads[int(i)][grad] = (a[0] if one else a).tolist()
        elif name.startswith("grad_state_dict."):
            key = name.removeprefix("grad_state_dict.")
            g = mine[STATE_DICT[key]]
            out.setdefault("grad_state_dict", {})[key] = (g.T if g.ndim == 2 else g).tolist()
        else:
            out[name] = (mine[name][0] if one else mine[name]).tolist()
    return out


def entry(ans: dict[str, Any], name: str) -> dict[str, Any]:
    return next(e for e in ans["comparison"] if e["name"] == name)


CASES = ["q_lora-interleave-bias", "q_proj-half-batch"]


@pytest.mark.parametrize("case", CASES)
def test_the_learners_hand_backward_without_its_bugs_is_autograds(case: str) -> None:
    _, layer, d_y, theirs = learner(case)
    mine = by_hand(layer, d_y)
    checked = [n for n in ("grad_x", "grad_c_kv", "grad_k_rope", "grad_q", "grad_v", "grad_c_q")
               if n in theirs]  # fmt: skip
    assert {"grad_x", "grad_c_kv", "grad_k_rope", "grad_q"} <= set(checked)
    for name in checked:  # autograd's are (B, …) as the learner's
        assert np.allclose(mine[name], theirs[name].detach().numpy(), rtol=0, atol=1e-10), name


@pytest.mark.parametrize("case", CASES)
def test_right_gradients_match_and_are_never_diagnosed(client: TestClient, case: str) -> None:
    body, layer, d_y, _ = learner(case)
    mine = by_hand(layer, d_y)
    names = (
        "heads.0.grad_q", "heads.1.grad_q", "grad_k_rope", "grad_c_kv", "grad_x",
        "grad_state_dict.kv_b_proj.weight", "grad_state_dict.kv_a_proj_with_mqa.weight",
    )  # fmt: skip
    ans = post(client, body | {"expected": expected(mine, body, names)})
    assert ans["first_mismatch"] is None, ans["comparison"]
    assert len(ans["comparison"]) == len(names)
    assert all(e["match"] and e["diagnosis"] is None for e in ans["comparison"])


ALONE = [
    (Bugs(diagonal=True), ["softmax_grad_diagonal"], "your dS has no −D term"),
    (Bugs(unweighted="every"), ["softmax_grad_row_term_unweighted"], "over every key"),
    (Bugs(unweighted="allowed"), ["softmax_grad_row_term_unweighted"], "allowed"),
    (Bugs(scale_missing=True), ["grad_scale_missing"], "scale"),
    (Bugs(transposed="dv"), ["grad_transposed"], "dV = Pᵀ dO"),
    (Bugs(transposed="dk"), ["grad_transposed"], "dK = dSᵀ Q"),
    (Bugs(rope_forward=True), ["rope_grad_not_inverted"], "q_pe's and the shared k_pe's"),
    (Bugs(member=1), ["kv_grad_not_summed"], "taken from query head 1 instead of summed over the 2"),
]  # fmt: skip


@pytest.mark.parametrize(("bugs", "codes", "says"), ALONE)
@pytest.mark.parametrize("case", CASES)
def test_each_mistake_is_named_from_grad_x(
    client: TestClient, case: str, bugs: Bugs, codes: list[str], says: str
) -> None:
    body, layer, d_y, _ = learner(case)
    ans = post(client, body | {"expected": expected(by_hand(layer, d_y, bugs), body, ("grad_x",))})
    assert ans["first_mismatch"] == "grad_x"
    found = entry(ans, "grad_x")
    assert found["diagnosis"] is not None, found["message"]
    assert found["diagnosis"]["mistakes"] == codes
    assert says in found["diagnosis"]["explanation"]
    assert found["diagnosis_complete"] is True
    assert f"Recomputing with {' + '.join(codes)} reproduces your numbers" in found["message"]


# each from the first gradient it changes among those the learner checks, or from one parameter
FROM = [
    (Bugs(rope_forward=True), ("grad_c_kv", "grad_k_rope", "heads.0.grad_q"), "heads.0.grad_q",
     ["rope_grad_not_inverted"]),
    (Bugs(member=0), ("heads.1.grad_q", "grad_c_kv", "grad_k_rope"), "grad_k_rope",
     ["kv_grad_not_summed"]),
    (Bugs(transposed="dv"), ("heads.0.grad_q", "grad_k_rope", "grad_c_kv"), "grad_c_kv",
     ["grad_transposed"]),
    (Bugs(diagonal=True), ("grad_state_dict.kv_b_proj.weight",),
     "grad_state_dict.kv_b_proj.weight", ["softmax_grad_diagonal"]),
    (Bugs(member=1), ("grad_state_dict.kv_b_proj.weight",
                      "grad_state_dict.kv_a_proj_with_mqa.weight"),
     "grad_state_dict.kv_a_proj_with_mqa.weight", ["kv_grad_not_summed"]),
    (Bugs(rope_forward=True), ("grad_state_dict.kv_b_proj.weight", "grad_state_dict.q_a_proj.weight"),
     "grad_state_dict.q_a_proj.weight", ["rope_grad_not_inverted"]),
    (Bugs(scale_missing=True, rope_forward=True), ("grad_x",), "grad_x",
     ["grad_scale_missing", "rope_grad_not_inverted"]),
    (Bugs(diagonal=True, member=1), ("grad_state_dict.kv_a_proj_with_mqa.weight",),
     "grad_state_dict.kv_a_proj_with_mqa.weight", ["softmax_grad_diagonal", "kv_grad_not_summed"]),
    (Bugs(rope_forward=True, member=0), ("grad_x",), "grad_x",
     ["rope_grad_not_inverted", "kv_grad_not_summed"]),
]  # fmt: skip


@pytest.mark.parametrize(("bugs", "names", "first", "codes"), FROM)
def test_a_mistake_or_pair_is_named_from_the_first_gradient_it_changes(
    client: TestClient, bugs: Bugs, names: tuple[str, ...], first: str, codes: list[str]
) -> None:
    body, layer, d_y, _ = learner("q_lora-interleave-bias")
    ans = post(client, body | {"expected": expected(by_hand(layer, d_y, bugs), body, names)})
    assert ans["first_mismatch"] == first
    found = entry(ans, first)
    assert found["diagnosis"] is not None, found["message"]
    assert found["diagnosis"]["mistakes"] == codes
    if len(codes) == 2:
        assert found["diagnosis"]["explanation"].startswith("Two mistakes")


@pytest.mark.parametrize("name", ["grad_x", "grad_c_kv", "grad_state_dict.kv_b_proj.weight"])
def test_a_difference_no_listed_mistake_makes_is_said_so(client: TestClient, name: str) -> None:
    body, layer, d_y, _ = learner("q_lora-interleave-bias")
    mine = by_hand(layer, d_y)
    key = STATE_DICT.get(name.removeprefix("grad_state_dict."), name)
    mine[key] = mine[key] * 1.5
    ans = post(client, body | {"expected": expected(mine, body, (name,))})
    found = entry(ans, name)
    assert ans["first_mismatch"] == name and found["diagnosis"] is None
    assert "No listed mistake, alone or in pairs, reproduces your numbers" in found["message"]
    assert found["diagnosis_complete"] is True
