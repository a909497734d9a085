"""The head's chain written once (service.core.chain): what each step reads (made_from), a
trial's computation run in place of a step's, a run split in two. Expected numbers are NumPy
written here from the definitions (Vaswani et al. 2017, eq. 1), never the engine's."""

import numpy as np
import numpy.typing as npt
import pytest

from service.core import chain
from service.core.attention import scaled_dot_product_attention
from service.core.positions import Rope
from service.core.variants import QKNorm, Variants

Array = npt.NDArray[np.float64]
RNG = np.random.default_rng(11)
Q, K, V = (RNG.normal(size=(3, 4)) for _ in range(3))


def softmax(s: Array) -> Array:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    out: Array = e / e.sum(axis=-1, keepdims=True)
    return out


@pytest.mark.parametrize("after", [False, True])
def test_each_step_reads_the_form_made_last_before_it(after: bool) -> None:
    """Qwen3 norms before RoPE, Llama 4 after it: RoPE and the norm read each other's
    result in that order, and the scores read the queries' and keys' last form."""
    norm = QKNorm(after_rope=after)
    v = Variants(q_norm=norm, k_norm=norm, rope=Rope(), v_norm=QKNorm())
    made = chain.made_with(v, masked=True)
    first, second = ("q_rotated", "q_normed") if after else ("q_normed", "q_rotated")
    assert made.index(first) < made.index(second)
    assert chain.made_from(first, made) == "q"
    assert chain.made_from(second, made) == first
    assert chain.made_from("scores", made) == second
    assert chain.made_from("scores", made, slot="k") == second.replace("q_", "k_")
    assert chain.made_from("weights", made) == "masked_scores"
    assert chain.made_from("output", made, slot="v") == "v_normed"


def test_a_step_not_made_reads_what_it_would_read() -> None:
    """No variant on: the scores read Q, the weights the scaled scores, V is V."""
    made = chain.made_with(Variants())
    assert made == ("q", "k", "v", "scores", "scaled_scores", "weights", "output")
    assert chain.made_from("q_rotated", made) == "q"
    assert chain.made_from("weights", made) == "scaled_scores"
    assert chain.made_from("present_v", made) == "v"


def test_a_trial_runs_its_computation_in_place_of_the_step() -> None:
    """The scale left out (the scores passed through): softmax(Q Kᵀ) V, the scores kept."""
    setup = chain.Setup(Variants(), scale=0.5)
    trial: chain.Trial = {"scaled_scores": lambda scores, st, s: scores}
    st = chain.run(chain.HEAD, chain.start(Q, K, V), setup, trial)
    w = softmax(Q @ K.T)
    np.testing.assert_allclose(st.made["weights"], w, rtol=1e-12)
    np.testing.assert_allclose(st.made["output"], w @ V, rtol=1e-12)
    np.testing.assert_array_equal(st.made["scaled_scores"], st.made["scores"])
    assert st.latest == {
        "q": "q",
        "k": "k",
        "v": "v",
        "scores": "scaled_scores",
        "weights": "weights",
        "out": "output",
    }


def test_a_run_split_in_two_is_the_whole_run() -> None:
    """The steps up to the scaled scores, then the rest from that state: the same output."""
    setup = chain.Setup(Variants(softcap=2.0), scale=0.5)
    at = next(i for i, step in enumerate(chain.HEAD) if step.name == "scaled_scores") + 1
    half = chain.run(chain.HEAD, chain.start(Q, K, V), setup, stop=at)
    assert "weights" not in half.made and half.latest["scores"] == "scaled_scores"
    whole = chain.run(chain.HEAD, half, setup, start=at)
    capped = 2.0 * np.tanh(Q @ K.T * 0.5 / 2.0)
    np.testing.assert_allclose(whole.made["output"], softmax(capped) @ V, rtol=1e-12)


def test_every_name_the_chain_makes_is_read_from_the_engines_trace_by_name() -> None:
    trace = scaled_dot_product_attention(Q, K, V, variants=Variants(softcap=2.0))
    assert set(chain.ORDER) <= chain.NAMES and {"position_bias", "sink_weights"} <= chain.NAMES
    assert all(getattr(trace, name) is trace.made.get(name) for name in chain.NAMES)
    assert trace.capped_scores is not None and trace.q_rotated is None
    with pytest.raises(AttributeError):
        trace.no_such_step  # noqa: B018  # a name no step makes is an error, not None
