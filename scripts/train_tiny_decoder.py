"""Train ``tiny-decoder``: a small causal BERT (``BertLMHeadModel``, ``is_decoder=True``) with
induction heads, on English text that ships with CPython.

Run: ``.venv/bin/python scripts/train_tiny_decoder.py --out models/tiny-decoder`` (torch and
transformers installed; about three to four minutes on two idle CPU cores). Everything is seeded:
tokenizer, data, initialisation and data order. Reruns on the same machine and library versions
give the same weights; float training is not bitwise reproducible across CPUs, BLAS builds or
torch versions, so another machine may end on slightly different weights (the tests check the
properties, not the bits).

Data
----
The text is CPython's ``pydoc_data.topics.topics`` (the help topics, ~465k characters of English
prose and code), its entries sorted by key and joined by blank lines (:func:`build_training_text`).
Its SHA-256 is :data:`DATA_SHA256`; the script refuses to run on any other text, since every
CPython release regenerates these topics (the recorded text is Python 3.11.7's).

A model trained on natural text alone may learn to copy at a fixed distance (a positional
shortcut) rather than by content. The sequences therefore repeat spans at random distances
(:class:`BatchMaker`): natural text windows; text windows in which a random span is copied to a
later random offset; and blocks of random tokens repeated after a random gap, with targets that
cannot be predicted (a random token's first occurrence) left out of the loss.

Training is a two-step curriculum. With this mixture from the start (or with text alone), no
induction head had formed after 2,500-3,000 steps: the model learns text statistics first and
stays on the plateau that precedes induction heads. On repeated random tokens alone the heads
form after some 400-800 steps (a sharp phase change), so the run starts with those and switches
to the mixture once a layer >= 1 head's induction score reaches ``switch_induction``; the
mixture then teaches the text while the repeats keep the heads. It stops when a head reaches
``target_induction`` after ``min_mixed_steps`` of the mixture, or at ``max_steps``.

Model and files
---------------
``models/tiny-decoder/``: ``tokenizer.json`` (a WordPiece tokenizer trained on the same text,
lowercased, whitespace pre-tokenizer, ``[BOS]`` prepended by its post-processor);
``model.safetensors`` (the ``BertModel`` part, BertModel's own key names, float32);
``lm_head.safetensors`` (``BertOnlyMLMHead``'s transform and bias, ``cls.predictions.*`` keys;
its decoder weight is tied to ``embeddings.word_embeddings.weight``); ``config.json``
(``BertConfig`` as transformers writes it, plus ``"tokenizer"``, ``"lm_head"`` and
``"training"`` records: data checksum, seed, steps, time, losses, induction scores per head).

transformers 5.23's ``BertModel`` is causal when ``config.is_decoder`` is true: its
``_create_attention_masks`` calls ``masking_utils.create_causal_mask`` (for eager attention a
float mask, 0 on and below the diagonal, the dtype's minimum above), with or without past key
values; ``BertAttention`` is built with ``is_causal=config.is_decoder`` for the SDPA/flash paths.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import string
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from safetensors.torch import save_file
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import BertConfig, BertLMHeadModel

# SHA-256 of build_training_text()'s UTF-8 bytes under CPython 3.11.7.
DATA_SHA256 = "71f2ff5d99bdc1f9c48c5c2353ad138201c5ca1c377e0226857ef8fa89b8bcee"
DATA_PYTHON = "3.11.7"
DATA_SOURCE = "CPython's pydoc_data.topics.topics: entries sorted by key, joined by '\\n\\n', UTF-8"

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[BOS]")
PAD, UNK, BOS = 0, 1, 2  # their ids: the trainer gives special tokens the first ids, in order
IGNORE = -100  # a target left out of the loss


@dataclass(frozen=True)
class Settings:
    """Every choice the run depends on (recorded in config.json)."""

    seed: int = 2026
    vocab_size: int = 2048
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 256
    max_position_embeddings: int = 128
    seq_len: int = 128  # BOS + 127 tokens
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    max_steps: int = 2500  # the budget; the cosine schedule spans it
    eval_every: int = 100  # induction check on the eval set
    log_every: int = 50
    # Curriculum: repeated random tokens only, until a layer >= 1 head's induction score reaches
    # switch_induction (or for max_repeat_steps), then the mixture; the run stops once, after at
    # least min_mixed_steps of the mixture, a layer >= 1 head reaches target_induction.
    switch_induction: float = 0.3
    max_repeat_steps: int = 1500
    min_mixed_steps: int = 1000
    target_induction: float = 0.9
    p_text: float = 0.25  # the mixture: plain natural-text windows,
    p_copy: float = 0.25  # text windows with a copied span,
    # and for the rest, random tokens repeated (BatchMaker._repeat)
    eval_repeat_len: int = 40
    eval_sequences: int = 8
    val_fraction: float = 0.05


# --------------------------------------------------------------------------------------- data


def build_training_text() -> str:
    """The training text: pydoc's topics sorted by key, joined by blank lines."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def checked_training_text() -> str:
    """The training text, or SystemExit if it is not the recorded one."""
    text = build_training_text()
    digest = text_sha256(text)
    if digest != DATA_SHA256:
        here = platform.python_version()
        why = (
            f"CPython regenerates pydoc's topics in every release: the recorded text is Python "
            f"{DATA_PYTHON}'s and this is Python {here}. Train with Python {DATA_PYTHON} to "
            "reproduce models/tiny-decoder"
            if here != DATA_PYTHON
            else f"this is Python {here}, the recorded text's version, so this installation's "
            "pydoc_data/topics.py differs from the release's"
        )
        raise SystemExit(
            "refusing to train: the training text built from pydoc_data.topics has SHA-256 "
            f"{digest}, not the recorded {DATA_SHA256}. {why}."
        )
    return text


# While the vocabulary is learnt, a character inside a word (WordPiece's "##" continuation) is
# written as this offset plus its code point (Supplementary Private Use Area-A), so that tokenizers'
# BPE trainer, which is deterministic without a continuing-subword prefix, learns WordPiece's
# vocabulary. (WordPieceTrainer is not: it numbers the "##x" pieces in hash-map order, so ties
# between equally frequent pairs, and so the vocabulary, change from one process to the next.)
CONTINUATION = 0xF0000


def _mark(word: str) -> str:
    return word[0] + "".join(chr(CONTINUATION + ord(c)) for c in word[1:])


def _unmark(piece: str) -> str:
    """A marked BPE piece as a WordPiece token ("##" + characters for a continuation piece)."""
    if piece in SPECIAL_TOKENS:
        return piece
    if ord(piece[0]) >= CONTINUATION:
        return "##" + "".join(chr(ord(c) - CONTINUATION) for c in piece)
    assert all(ord(c) >= CONTINUATION for c in piece[1:]), piece
    return piece[0] + "".join(chr(ord(c) - CONTINUATION) for c in piece[1:])


def train_tokenizer(text: str, vocab_size: int) -> Tokenizer:
    """A WordPiece tokenizer (BERT's greedy longest match, "##" continuation pieces), lowercased,
    split by ``Whitespace`` (``\\w+|[^\\w\\s]+``), with ``[BOS]`` prepended to every encoding.

    Its vocabulary is what tokenizers' WordPieceTrainer learns (BPE merges over the words, a
    piece inside a word marked), computed deterministically (see :data:`CONTINUATION`). The
    alphabet holds every character of the text and every printable ASCII character, each both
    as a word start and as a "##" piece, so that ASCII text never needs ``[UNK]``.
    """
    normalizer = normalizers.Lowercase()
    pre_tokenizer = pre_tokenizers.Whitespace()
    chars = set(normalizer.normalize_str(text)) | set(string.printable.lower())
    chars -= set(string.whitespace)
    assert all(ord(c) < 0x10000 for c in chars), "a character outside the BMP"
    alphabet = sorted(chars | {chr(CONTINUATION + ord(c)) for c in chars})

    def marked_topics() -> Iterator[str]:
        for chunk in text.split("\n\n"):
            words = pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(chunk))
            yield " ".join(_mark(word) for word, _ in words)

    learner = Tokenizer(models.BPE())
    learner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    learner.train_from_iterator(marked_topics(), trainer=trainer)
    vocab = {_unmark(piece): i for piece, i in learner.get_vocab().items()}
    assert len(vocab) == learner.get_vocab_size() == vocab_size, (len(vocab), vocab_size)
    for token_id, token in enumerate(SPECIAL_TOKENS):
        assert vocab[token] == token_id, (token, vocab[token])

    tokenizer = Tokenizer(
        models.WordPiece(
            vocab, unk_token="[UNK]", continuing_subword_prefix="##", max_input_chars_per_word=100
        )
    )
    tokenizer.normalizer = normalizer
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[BOS] $A", pair="[BOS] $A $B", special_tokens=[("[BOS]", BOS)]
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


IntArray = npt.NDArray[np.int64]


class BatchMaker:
    """Training sequences (``[BOS]`` + ``seq_len - 1`` tokens) and their targets.

    Three kinds, drawn at random for each sequence:

    - text: a window of the token stream;
    - copy: a text window in which a span of 4-40 tokens is copied over a later part of the
      window, at a random distance;
    - repeat: a block of 4-40 distinct random ordinary tokens, then half the time a gap of
      1-20 other random tokens, then the block again and again to the end; half the time
      after a text prefix of 1-40 tokens. The block's first occurrence and the gap are not
      targets (nothing predicts them).
    """

    def __init__(self, stream: IntArray, settings: Settings, rng: np.random.Generator) -> None:
        self.stream = stream
        self.s = settings
        self.rng = rng
        self.body = settings.seq_len - 1
        self.ordinary = np.arange(len(SPECIAL_TOKENS), settings.vocab_size, dtype=np.int64)

    def _window(self, n: int) -> IntArray:
        start = int(self.rng.integers(0, len(self.stream) - n))
        return self.stream[start : start + n].copy()

    def _text(self) -> tuple[IntArray, IntArray]:
        tokens = self._window(self.body)
        return tokens, tokens.copy()

    def _copy(self) -> tuple[IntArray, IntArray]:
        tokens = self._window(self.body)
        span = int(self.rng.integers(4, 41))
        src = int(self.rng.integers(0, self.body - 2 * span + 1))
        dst = int(self.rng.integers(src + span, self.body - span + 1))
        tokens[dst : dst + span] = tokens[src : src + span]
        return tokens, tokens.copy()

    def _repeat(self) -> tuple[IntArray, IntArray]:
        rng = self.rng
        block_len = int(rng.integers(4, 41))
        block = rng.choice(self.ordinary, size=block_len, replace=False)
        gap_len = int(rng.integers(1, 21)) if rng.random() < 0.5 else 0
        gap = rng.choice(self.ordinary, size=gap_len)
        prefix = self._window(int(rng.integers(1, 41))) if rng.random() < 0.5 else self.stream[:0]
        parts = [prefix, block, gap]
        labels = [prefix.copy(), np.full(block_len + gap_len, IGNORE, dtype=np.int64)]
        length = len(prefix) + block_len + gap_len
        while length < self.body:  # the block again and again
            parts.append(block)
            labels.append(block)
            length += block_len
        return np.concatenate(parts)[: self.body], np.concatenate(labels)[: self.body]

    def batch(self, mixed: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of the mixture, or (``mixed`` false) of repeated random tokens only."""
        inputs = np.empty((self.s.batch_size, self.s.seq_len), dtype=np.int64)
        labels = np.empty_like(inputs)
        for row in range(self.s.batch_size):
            u = self.rng.random() if mixed else 1.0
            if u < self.s.p_text:
                tokens, targets = self._text()
            elif u < self.s.p_text + self.s.p_copy:
                tokens, targets = self._copy()
            else:
                tokens, targets = self._repeat()
            inputs[row, 0], inputs[row, 1:] = BOS, tokens
            labels[row, 0], labels[row, 1:] = IGNORE, targets
        return torch.from_numpy(inputs), torch.from_numpy(labels)


# --------------------------------------------------------------------------------- induction


def induction_score(weights: npt.NDArray[np.float64], tokens: list[int]) -> float | None:
    """The contract's induction score of one head: the mean, over the positions i whose token
    occurred before, of ``weights[i][j + 1]`` with j the most recent earlier occurrence of that
    token; None when no token repeats. ``weights`` is L x L, rows are queries."""
    last_seen: dict[int, int] = {}
    values: list[float] = []
    for i, token in enumerate(tokens):
        j = last_seen.get(token)
        if j is not None:
            values.append(float(weights[i][j + 1]))
        last_seen[token] = i
    return sum(values) / len(values) if values else None


def repeated_random_sequence(rng: np.random.Generator, n: int, vocab_size: int) -> list[int]:
    """``[BOS]`` then n distinct random ordinary tokens, twice."""
    block = rng.choice(np.arange(len(SPECIAL_TOKENS), vocab_size), size=n, replace=False)
    return [BOS, *(int(t) for t in block), *(int(t) for t in block)]


def head_scores(model: BertLMHeadModel, sequences: list[list[int]]) -> list[list[float]]:
    """Induction score of every head (layer x head), averaged over the sequences."""
    total: npt.NDArray[np.float64] | None = None
    with torch.no_grad():
        for tokens in sequences:
            out = model.bert(torch.tensor([tokens]), output_attentions=True, use_cache=False)
            per_head = np.array(
                [
                    [
                        induction_score(layer[0, h].double().numpy(), tokens) or 0.0
                        for h in range(layer.shape[1])
                    ]
                    for layer in out.attentions
                ]
            )
            total = per_head if total is None else total + per_head
    assert total is not None
    return [[round(float(v), 4) for v in row] for row in total / len(sequences)]


def previous_token_scores(model: BertLMHeadModel, sequences: list[list[int]]) -> list[list[float]]:
    """Mean weight on the previous token (``w[i][i - 1]``, i >= 1) of every head, averaged over
    the sequences: the previous-token heads that induction heads read in layer 0."""
    total: npt.NDArray[np.float64] | None = None
    with torch.no_grad():
        for tokens in sequences:
            out = model.bert(torch.tensor([tokens]), output_attentions=True, use_cache=False)
            per_head = np.array(
                [
                    torch.diagonal(layer[0], offset=-1, dim1=-2, dim2=-1).double().mean(-1).numpy()
                    for layer in out.attentions
                ]
            )
            total = per_head if total is None else total + per_head
    assert total is not None
    return [[round(float(v), 4) for v in row] for row in total / len(sequences)]


def best_late_head(scores: list[list[float]]) -> tuple[int, int, float]:
    """(layer, head, score) of the best head in layers >= 1."""
    return max(
        (
            (layer, head, s)
            for layer, row in enumerate(scores)
            for head, s in enumerate(row)
            if layer >= 1
        ),
        key=lambda t: t[2],
    )


def repeat_loss(model: BertLMHeadModel, sequences: list[list[int]]) -> float:
    """Mean next-token loss on the second copy of repeated random sequences."""
    losses = []
    with torch.no_grad():
        for tokens in sequences:
            n = (len(tokens) - 1) // 2
            logits = model(torch.tensor([tokens]), use_cache=False).logits[0]
            targets = torch.tensor(tokens[n + 2 :])
            losses.append(float(torch.nn.functional.cross_entropy(logits[n + 1 : -1], targets)))
    return sum(losses) / len(losses)


def text_loss(model: BertLMHeadModel, stream: IntArray, seq_len: int) -> float:
    """Mean next-token loss on consecutive windows of held-out text."""
    body = seq_len - 1
    windows = [stream[k : k + body] for k in range(0, len(stream) - body, body)]
    inputs = torch.tensor(np.array([[BOS, *w] for w in windows]))
    with torch.no_grad():
        logits = model(inputs, use_cache=False).logits
    return float(
        torch.nn.functional.cross_entropy(
            logits[:, 1:-1].reshape(-1, logits.shape[-1]), inputs[:, 2:].reshape(-1)
        )
    )


# ---------------------------------------------------------------------------------- training


def bert_config(s: Settings) -> BertConfig:
    """The architecture: BERT's blocks (post-LN, GELU, learned absolute positions), causal."""
    config = BertConfig(
        vocab_size=s.vocab_size,
        hidden_size=s.hidden_size,
        num_hidden_layers=s.num_hidden_layers,
        num_attention_heads=s.num_attention_heads,
        intermediate_size=s.intermediate_size,
        hidden_act="gelu",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        max_position_embeddings=s.max_position_embeddings,
        type_vocab_size=1,
        initializer_range=0.02,
        layer_norm_eps=1e-12,
        pad_token_id=PAD,
        bos_token_id=BOS,
        is_decoder=True,
        tie_word_embeddings=True,
    )
    config._attn_implementation = "eager"  # attention weights as the service computes them
    return config


def lr_at(step: int, s: Settings) -> float:
    """Linear warm-up, then cosine decay to a tenth over ``max_steps``."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    progress = (step - s.warmup_steps) / max(1, s.max_steps - s.warmup_steps)
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def train(s: Settings, out: Path) -> None:
    started = time.perf_counter()
    torch.set_num_threads(2)
    torch.manual_seed(s.seed)
    torch.use_deterministic_algorithms(True)
    np.random.seed(s.seed)
    rng = np.random.default_rng(s.seed)

    text = checked_training_text()
    tokenizer = train_tokenizer(text, s.vocab_size)
    assert tokenizer.get_vocab_size() == s.vocab_size, tokenizer.get_vocab_size()
    stream = np.array(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.int64)
    n_val = int(len(stream) * s.val_fraction)
    train_stream, val_stream = stream[:-n_val], stream[-n_val:]
    print(
        f"text: {len(text)} characters, sha256 {text_sha256(text)[:16]}…; tokenizer: "
        f"{tokenizer.get_vocab_size()} tokens; stream: {len(train_stream)} train + "
        f"{len(val_stream)} held-out tokens",
        flush=True,
    )

    config = bert_config(s)
    model = BertLMHeadModel(config)
    tied = model.cls.predictions.decoder.weight is model.bert.embeddings.word_embeddings.weight
    assert tied, "the LM head's decoder is expected to be tied to the word embeddings"
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: BertLMHeadModel, {n_params} parameters", flush=True)

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embeddings" not in n]
    no_decay = [
        p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embeddings" not in n)
    ]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": s.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=s.lr,
        betas=(0.9, 0.98),
    )
    batches = BatchMaker(train_stream, s, rng)
    eval_rng = np.random.default_rng(s.seed + 1)
    eval_set = [
        repeated_random_sequence(eval_rng, s.eval_repeat_len, s.vocab_size)
        for _ in range(s.eval_sequences)
    ]

    curve: list[tuple[int, float]] = []
    checks: list[dict[str, Any]] = []
    window: list[float] = []
    step = 0
    stop_reason = f"budget of {s.max_steps} steps"
    mixed_from: int | None = None  # the step the mixture starts (before: repeats only)
    while step < s.max_steps:
        model.train()
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, s)
        if mixed_from is None and step >= s.max_repeat_steps:
            mixed_from = step
        inputs, labels = batches.batch(mixed=mixed_from is not None)
        logits = model(inputs, use_cache=False).logits
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, s.vocab_size),
            labels[:, 1:].reshape(-1),
            ignore_index=IGNORE,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        optimizer.step()
        step += 1
        window.append(loss.item())
        if step % s.log_every == 0:
            mean = sum(window) / len(window)
            curve.append((step, round(mean, 4)))
            window = []
            print(
                f"step {step:5d}  loss {mean:.4f}  lr {lr_at(step - 1, s):.2e}  "
                f"{time.perf_counter() - started:6.1f}s",
                flush=True,
            )
        if step % s.eval_every == 0:
            model.train(False)
            scores = head_scores(model, eval_set)
            layer, head, best = best_late_head(scores)
            checks.append({"step": step, "best_layer_ge_1": [layer, head, best]})
            print(
                f"   induction: best layer>=1 head {layer}.{head} = {best:.3f}; {scores}",
                flush=True,
            )
            if mixed_from is None and best >= s.switch_induction:
                mixed_from = step
                print(f"   from step {step}: the mixture of text, copies and repeats", flush=True)
            elif (
                mixed_from is not None
                and step - mixed_from >= s.min_mixed_steps
                and (best >= s.target_induction)
            ):
                stop_reason = f"layer {layer} head {head} reached induction {best:.3f}"
                break
    train_seconds = time.perf_counter() - started

    model.train(False)
    final_scores = head_scores(model, eval_set)
    layer, head, best = best_late_head(final_scores)
    other_lengths = {
        str(n): head_scores(
            model,
            [
                repeated_random_sequence(np.random.default_rng(s.seed + 2 + n), n, s.vocab_size)
                for _ in range(4)
            ],
        )
        for n in (10, 25, 60)
    }
    record: dict[str, Any] = {
        "data": {
            "source": DATA_SOURCE,
            "sha256": DATA_SHA256,
            "python": platform.python_version(),
            "characters": len(text),
            "tokens": len(stream),
            "held_out_tokens": int(n_val),
            "held_out": "the stream's last tokens, left out of the LM training (not the tokenizer's)",
        },
        "parameters": n_params,
        "seed": s.seed,
        "steps": step,
        "stopped": stop_reason,
        "repeats_only_until": mixed_from,
        "seconds": round(train_seconds, 1),
        "threads": torch.get_num_threads(),
        "final_train_loss": curve[-1][1] if curve else None,
        "uniform_loss": round(math.log(s.vocab_size), 4),
        "held_out_text_loss": round(text_loss(model, val_stream, s.seq_len), 4),
        "repeat_second_copy_loss": round(repeat_loss(model, eval_set), 4),
        "induction": {
            "definition": (
                "mean over positions i whose token occurred before of w[i][j+1], j the most "
                "recent earlier occurrence"
            ),
            "eval": (
                f"{s.eval_sequences} sequences of [BOS] + {s.eval_repeat_len} distinct random "
                f"ordinary tokens repeated twice (numpy default_rng({s.seed + 1})); mean per head"
            ),
            "scores": final_scores,
            "best_layer_ge_1": {"layer": layer, "head": head, "score": best},
            "other_repeat_lengths": other_lengths,
            "previous_token": previous_token_scores(model, eval_set),
        },
        "checks": checks,
        "loss_curve_is": (
            f"(step, mean training loss over the {s.log_every} steps before it); repeats only "
            "until repeats_only_until, the mixture after"
        ),
        "loss_curve": curve,
        "settings": asdict(s),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "tokenizers": __import__("tokenizers").__version__,
        "numpy": np.__version__,
        "reproducibility": (
            "seeded (torch.manual_seed, numpy default_rng, deterministic algorithms): reruns on "
            "the same machine and versions give the same weights; float training is not bitwise "
            "reproducible across machines, BLAS builds or torch versions"
        ),
    }
    print(
        f"done: {step} steps in {train_seconds:.1f}s ({stop_reason}); final train loss "
        f"{record['final_train_loss']}, held-out text loss {record['held_out_text_loss']}, "
        f"repeat loss {record['repeat_second_copy_loss']}",
        flush=True,
    )
    for li, row in enumerate(final_scores):
        print(
            "  layer " + str(li) + ": " + "  ".join(f"head {h} {v:.3f}" for h, v in enumerate(row))
        )
    print(f"  best layer>=1 head: {layer}.{head} = {best:.3f}")
    print(f"  previous-token weight per head: {record['induction']['previous_token']}")
    save(model, tokenizer, config, record, out)
    print(f"total wall time {time.perf_counter() - started:.1f}s")


def save(
    model: BertLMHeadModel,
    tokenizer: Tokenizer,
    config: BertConfig,
    record: dict[str, Any],
    out: Path,
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    bert = {
        k: v.detach().to(torch.float32).contiguous() for k, v in model.bert.state_dict().items()
    }
    save_file(bert, str(out / "model.safetensors"), metadata={"format": "pt"})
    head = {
        k: v.detach().to(torch.float32).contiguous()
        for k, v in model.state_dict().items()
        if k.startswith("cls.")
        and k != "cls.predictions.decoder.weight"
        and k != "cls.predictions.decoder.bias"
    }
    save_file(head, str(out / "lm_head.safetensors"), metadata={"format": "pt"})
    record["files"] = {
        name: {
            "bytes": (out / name).stat().st_size,
            "sha256": hashlib.sha256((out / name).read_bytes()).hexdigest(),
        }
        for name in ("tokenizer.json", "model.safetensors", "lm_head.safetensors")
    }
    config.save_pretrained(str(out))
    written = json.loads((out / "config.json").read_text())
    written["tokenizer"] = {
        "file": "tokenizer.json",
        "model": (
            "WordPiece: greedy longest match, pieces inside a word prefixed '##', a word of more "
            "than 100 characters or with no match is [UNK]"
        ),
        "vocabulary": (
            "learnt on the training text: tokenizers' BpeTrainer over the lowercased words, "
            "characters inside a word marked (WordPieceTrainer's algorithm, deterministic); "
            "alphabet: the text's characters and printable ASCII, each as word start and '##'"
        ),
        "normalizer": "Lowercase",
        "pre_tokenizer": "Whitespace (regex \\w+|[^\\w\\s]+)",
        "post_processor": "TemplateProcessing: '[BOS] $A' (the BOS token is prepended)",
        "decoder": (
            "WordPiece: joins '##' pieces, BERT's cleanup (no space before . , ? ! and a few "
            "contractions); decode(encode(text)) is the lowercased text when its words are "
            "separated by single spaces and its only punctuation is . , ? ! after a word"
        ),
        "special_tokens": {t: i for i, t in enumerate(SPECIAL_TOKENS)},
        "bos_token": "[BOS]",
    }
    written["lm_head"] = {
        "file": "lm_head.safetensors",
        "class": "BertOnlyMLMHead (BertLMHeadModel's cls): dense, gelu, LayerNorm, decoder + bias",
        "decoder_weight": "tied: embeddings.word_embeddings.weight of model.safetensors",
        "keys": sorted(head),
    }
    written["training"] = record
    (out / "config.json").write_text(json.dumps(written, indent=2) + "\n")
    for path in sorted(out.iterdir()):
        print(f"wrote {path} ({path.stat().st_size} bytes)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("models/tiny-decoder"))
    parser.add_argument(
        "--max-steps",
        type=int,
        default=Settings.max_steps,
        help="the step budget (a smaller one is for trying the script; the schedule spans it)",
    )
    args = parser.parse_args(argv)
    train(Settings(max_steps=args.max_steps), args.out)


if __name__ == "__main__":
    main()
