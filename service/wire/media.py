"""The two forms of a body (API.md, "Binary arrays"): JSON or safetensors, read from the
request's ``Content-Type`` and chosen for the answer from its ``Accept`` header."""

from typing import Literal

MEDIA_TYPE = "application/x-safetensors"
JSON_TYPE = "application/json"
Format = Literal["json", "safetensors"]


def body_form(content_type: str) -> Format | None:
    """The form of a body by its ``Content-Type``: JSON (``application/json`` or any
    ``application/…+json``), safetensors, or None (415)."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == JSON_TYPE or (media.startswith("application/") and media.endswith("+json")):
        return "json"
    return "safetensors" if media == MEDIA_TYPE else None


def negotiate(accept: str | None) -> Format | None:
    """The response format an ``Accept`` header asks for: the type with the highest q that
    names it most specifically, the earlier one on a tie; JSON when there is no header; None
    when it names neither (406)."""
    if not accept or accept == "*/*" or accept == JSON_TYPE:
        return "json"
    # format -> (q, specificity, -position, JSON first on a full tie)
    best: dict[Format, tuple[float, int, int, bool]] = {}
    for position, part in enumerate(accept.split(",")):
        media, _, params = part.partition(";")
        media = media.strip().lower()
        q = _quality(params)
        for form, full in (("json", JSON_TYPE), ("safetensors", MEDIA_TYPE)):
            specificity = _matches(media, full)
            if specificity < 0:
                continue
            known = best.get(form)  # type: ignore[call-overload]
            if known is None or specificity > known[1]:  # the most specific range decides
                best[form] = (q, specificity, -position, form == "json")  # type: ignore[index]
    wanted = [(v, f) for f, v in best.items() if v[0] > 0]
    return max(wanted)[1] if wanted else None


def _quality(params: str) -> float:
    """The q of a media range's parameters (1 when absent, 0 when unreadable)."""
    for param in params.split(";"):
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return 0.0
            return q if 0.0 <= q <= 1.0 else 0.0
    return 1.0


def _matches(media: str, full: str) -> int:
    """How specifically ``media`` names ``full``: 2 exactly, 1 as type/*, 0 as */*, −1 not."""
    if media == full:
        return 2
    if media == full.split("/")[0] + "/*":
        return 1
    return 0 if media == "*/*" else -1


Coding = Literal["zstd", "br", "gzip"]
# the content codings the service produces, its preference first: zstd compresses JSON numbers
# best and fastest, brotli next, gzip last (measured: docs/performance.md, `make bench` Z rows)
CODINGS: tuple[Coding, ...] = ("zstd", "br", "gzip")


def content_coding(accept_encoding: str | None) -> Coding | None:
    """The content coding for an answer, by the request's ``Accept-Encoding`` (RFC 9110
    §12.5.3): among the codings the header accepts (named, or by ``*``, with q > 0; names
    case-insensitive) the one of highest q, the service's preference (:data:`CODINGS`) on a
    tie; None (identity) when there is no header, when it accepts none of them, or when it
    gives ``identity`` a higher q than any of them. Identity is sent even when the header
    refuses it too (``identity;q=0, *;q=0``): the RFC allows it, and an answer the client can
    always read beats a 406."""
    if not accept_encoding:
        return None
    named: dict[str, float] = {}
    for part in accept_encoding.split(","):
        token, _, params = part.partition(";")
        token = token.strip().lower()
        if token and token not in named:
            named[token] = _quality(params)
    star = named.get("*")
    default = 0.0 if star is None else star
    q, _, coding = max((named.get(c, default), -rank, c) for rank, c in enumerate(CODINGS))
    identity = named.get("identity", star)
    if q <= 0 or (identity is not None and identity > q):
        return None
    return coding
