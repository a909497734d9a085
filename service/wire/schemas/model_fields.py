"""The request body of POST /model: a trained model, a sentence, the layer to trace."""

from pydantic import BaseModel, Field

from service.wire.schemas.expected_fields import ExpectedArrays, ToleranceOptions
from service.wire.schemas.fields import GradOutput, Int, Text
from service.wire.schemas.mask_fields import STRICT


class ModelRequest(BaseModel):
    """POST /model: a trained model's attention on your sentence, every layer and head, and
    one layer's whole /multihead trace."""

    model_config = STRICT
    model: Text = Field(description="a name from GET /models, e.g. minilm or tiny-decoder")
    text: Text = Field(
        description="the sentence, tokenized by the model's own tokenizer with its special "
        "tokens, without padding or truncation"
    )
    layer: Int = Field(0, ge=0, description="the layer whose whole trace is returned (0-based)")
    include: list[Text] | None = Field(
        None,
        fail_fast=True,
        description="top-level outputs to return: model, tokens, attention, head_roles, "
        "rollout, trace, layer_weights (default: all but layer_weights, the chosen layer's "
        "/multihead fields besides x; an answer computes only what it returns)",
    )
    decimals: Int | None = Field(None, ge=0, le=15, description="round every returned float")
    expected: ExpectedArrays | None = Field(
        None,
        description="your own arrays of the chosen layer, named as the trace names them "
        "(/multihead's outputs); the trace then carries comparison and first_mismatch",
    )
    tolerance: ToleranceOptions | None = Field(
        None, description='when your numbers match: default {"atol": 1e-6, "rtol": 1e-6}'
    )
    grad_output: GradOutput | None = Field(
        None,
        description="the chosen layer's backward pass: ∂loss/∂(the layer's output, its "
        'layer_norm [L][d_model]), or "sum"; the trace then carries every gradient as '
        "/multihead's does (grad_x: what the loss asks of each token's hidden state; "
        "grad_weights per head; the layer's weight gradients)",
    )
