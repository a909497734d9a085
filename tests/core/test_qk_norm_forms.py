"""qk_norm's other forms (the third edition's configs): over each token's whole projection
(OLMo 2, OLMo 3, OLMoE, MiniMax-M2), a weight per head (Cohere's CohereLayerNorm, StableLM's
StableLmLayerNormPerHead) and a LayerNorm's bias (Phi), each against torch's own
``rms_norm``/``layer_norm`` in float64 written here, and with grouped-query attention's keys
repeated to the query heads before the norm, as the engine runs the heads."""

import numpy as np
import pytest

from service.core.errors import AttentionInputError
from service.core.variants import QKNorm, qk_norm
from tests.core.test_variants import reference

TOL = 1e-12
B, H, H_KV, L, D = 2, 4, 2, 5, 3
RNG = np.random.default_rng(41)


def heads(n: int) -> np.ndarray:
    return RNG.normal(size=(B, n, L, D)) * 3 + 0.5  # (B, n, L, d_k)


def tokens(x: np.ndarray) -> np.ndarray:
    """(B, n, L, d_k) → (B, L, n·d_k): each token's projection, heads side by side."""
    return x.transpose(0, 2, 1, 3).reshape(x.shape[0], x.shape[2], -1)


def split(y: np.ndarray, n: int) -> np.ndarray:
    """(B, L, n·d_k) → (B, n, L, d_k), as ``.view(B, L, -1, d).transpose(1, 2)``."""
    return y.reshape(y.shape[0], y.shape[1], n, -1).transpose(0, 2, 1, 3)


def torch_norm(kind: str, x: np.ndarray, shape: int, w: np.ndarray, eps: float) -> np.ndarray:
    torch = reference("torch")
    f = torch.nn.functional
    t, wt = torch.from_numpy(x), torch.from_numpy(w)
    out = (
        f.rms_norm(t, (shape,), wt, eps)
        if kind == "rms"
        else f.layer_norm(t, (shape,), wt, None, eps)
    )
    return np.asarray(out.numpy())


@pytest.mark.torch
@pytest.mark.parametrize("kind", ["rms", "layer"])
def test_over_projection_is_the_norm_of_each_tokens_h_times_dk_features(kind: str) -> None:
    """OLMo 2: ``q_norm = RMSNorm(num_heads * head_dim)`` on q_proj's output, then the view."""
    x, w = heads(H), RNG.normal(size=H * D)
    want = split(torch_norm(kind, tokens(x), H * D, w, 1e-6), H)
    got = qk_norm(x, QKNorm(kind, 1e-6, w, over="projection"))  # type: ignore[arg-type]
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)
    per_head = qk_norm(x, QKNorm(kind, 1e-6, w.reshape(H, D)))  # type: ignore[arg-type]
    assert np.abs(per_head - want).max() > 1e-3  # a different norm: the test tells them apart


@pytest.mark.torch
def test_over_projection_on_keys_repeated_for_gqa_equals_the_norm_before_the_repeat() -> None:
    """The engine repeats the h_kv key heads to h before the norm: the mean over the repeated
    heads is the original one, and the weight [h_kv·d_k] follows its heads."""
    k, w = heads(H_KV), RNG.normal(size=H_KV * D)
    normed = split(torch_norm("rms", tokens(k), H_KV * D, w, 1e-5), H_KV)
    want = np.repeat(normed, H // H_KV, axis=1)  # repeat_kv after the norm, as OLMo 2
    got = qk_norm(np.repeat(k, H // H_KV, axis=1), QKNorm("rms", 1e-5, w, over="projection"))
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)


@pytest.mark.torch
def test_a_weight_per_head_is_cohere_and_stablelms_layer_norm_per_head() -> None:
    """CohereLayerNorm((h, d)): LayerNorm over d_k with head i's own weight row; on keys
    repeated for GQA each key/value head's row serves its query heads."""
    k, w = heads(H_KV), RNG.normal(size=(H_KV, D))
    normed = np.stack(
        [torch_norm("layer", k[:, i], D, w[i], 1e-5) for i in range(H_KV)], axis=1
    )  # (B, h_kv, L, d_k)
    got = qk_norm(np.repeat(k, H // H_KV, axis=1), QKNorm("layer", 1e-5, w))
    np.testing.assert_allclose(got, np.repeat(normed, H // H_KV, axis=1), rtol=0, atol=TOL)


@pytest.mark.torch
def test_a_bias_is_phis_layer_norm_with_weight_and_bias() -> None:
    torch = reference("torch")
    x, w, b = heads(H), RNG.normal(size=D), RNG.normal(size=D)
    want = torch.nn.functional.layer_norm(
        torch.from_numpy(x), (D,), torch.from_numpy(w), torch.from_numpy(b), 1e-5
    ).numpy()
    got = qk_norm(x, QKNorm("layer", 1e-5, w, bias=b))
    np.testing.assert_allclose(got, want, rtol=0, atol=TOL)


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        (QKNorm("rms", 1e-6, bias=np.ones(D)), "bias needs type layer"),
        (QKNorm("rms", 1e-6, np.ones(3 * D)), "shape [9]"),
        (QKNorm("rms", 1e-6, np.ones((3, D))), "shape [3, 3]"),
        (QKNorm("rms", 1e-6, np.ones(D + 1), over="projection"), "shape [4]"),
    ],
    ids=["bias-with-rms", "flat-weight-over-head", "rows-not-dividing-heads", "odd-projection"],
)
def test_a_weight_or_bias_that_fits_no_form_is_refused(settings: QKNorm, says: str) -> None:
    with pytest.raises(AttentionInputError, match=says.replace("[", r"\[")):
        qk_norm(heads(H), settings)
