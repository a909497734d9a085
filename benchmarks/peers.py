"""Peers for row S1 of benchmarks/run.py: two tiny FastAPI apps that answer POST /attention with
the numbers of the service's default /attention response (q, k, v, scores, scaled_scores,
weights, output; none of its summary, steps or conventions) for the same body.

``lean``: the raw body through orjson into NumPy, computed inline, orjson out.
``tutorial``: a pydantic model with ``list[list[float]]`` fields as the body parameter, NumPy,
a dict of ``.tolist()`` lists through FastAPI's default JSON response (no response model).

Both read x, w_q, w_k, w_v in in_out layout (Q = X W_q), or transposed when the body says
``"weight_layout": "out_in"`` (P2's 3-token request does), and ignore every other field.
Run from the repository root with plain uvicorn, one worker:
``python -m uvicorn benchmarks.peers:lean --port N`` (or ``benchmarks.peers:tutorial``).
"""

from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Request, Response
from numpy.typing import NDArray
from pydantic import BaseModel

Array = NDArray[np.float64]


def attention(x: Array, w_q: Array, w_k: Array, w_v: Array) -> dict[str, Array]:
    """softmax(Q Kᵀ / √d_k) V with every step, the row softmax max-subtracted."""
    q, k, v = x @ w_q, x @ w_k, x @ w_v  # (L, d_k), (L, d_k), (L, d_v)
    scores = q @ k.T  # (L, L)
    scaled_scores = scores * (1.0 / float(np.sqrt(q.shape[-1])))
    weights = np.exp(scaled_scores - scaled_scores.max(axis=-1, keepdims=True))
    weights /= weights.sum(axis=-1, keepdims=True)
    output = weights @ v  # (L, d_v)
    return {"q": q, "k": k, "v": v, "scores": scores, "scaled_scores": scaled_scores,
            "weights": weights, "output": output}  # fmt: skip


lean = FastAPI()


@lean.post("/attention")
async def lean_attention(request: Request) -> Response:
    body = orjson.loads(await request.body())
    x, w_q, w_k, w_v = (np.asarray(body[n], dtype=np.float64) for n in ("x", "w_q", "w_k", "w_v"))
    if body.get("weight_layout") == "out_in":
        w_q, w_k, w_v = w_q.T, w_k.T, w_v.T
    arrays = attention(x, w_q, w_k, w_v)
    return Response(
        orjson.dumps(arrays, option=orjson.OPT_SERIALIZE_NUMPY), media_type="application/json"
    )


tutorial = FastAPI()


class AttentionBody(BaseModel):
    x: list[list[float]]
    w_q: list[list[float]]
    w_k: list[list[float]]
    w_v: list[list[float]]
    weight_layout: str = "in_out"


@tutorial.post("/attention", response_model=None)
def tutorial_attention(body: AttentionBody) -> dict[str, Any]:
    x = np.array(body.x)
    w_q, w_k, w_v = np.array(body.w_q), np.array(body.w_k), np.array(body.w_v)
    if body.weight_layout == "out_in":
        w_q, w_k, w_v = w_q.T, w_k.T, w_v.T
    return {name: a.tolist() for name, a in attention(x, w_q, w_k, w_v).items()}
