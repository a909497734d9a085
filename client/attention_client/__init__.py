"""A client of the attention service: NumPy (or torch) arrays in, NumPy arrays out.

    from attention_client import Client

    with Client("http://127.0.0.1:8000") as client:
        result = client.attention(q=q, k=k, v=v, mask={"type": "causal"})
        result.weights, result.masked_scores, result.steps

Requests and answers travel as safetensors (``binary=False``: JSON, same results).
``Client.local()`` runs the service inside this process instead (no server; it must be
installed here), and a result shown in Jupyter draws its maps as heatmaps.
"""

from attention_client import masks
from attention_client.client import AsyncClient, Client
from attention_client.errors import (
    ErrorItem,
    InvalidRequest,
    ModelNotInstalled,
    Overloaded,
    ServiceError,
    TooLarge,
    Unauthorized,
)
from attention_client.result import Head, Result

__all__ = [
    "AsyncClient",
    "Client",
    "ErrorItem",
    "Head",
    "InvalidRequest",
    "ModelNotInstalled",
    "Overloaded",
    "Result",
    "ServiceError",
    "TooLarge",
    "Unauthorized",
    "masks",
]
__version__ = "0.1.0"
