"""The steps of attention recomputed under a set of mistakes, for the diagnosis
(:mod:`service.core.diagnosis.search`): :func:`recompute` runs :data:`~service.core.diagnosis.stages.STAGES`
from the first one a trial changes up to the target, :func:`recomputations` runs the variants
of one set of mistakes sharing the stages they agree on, and :func:`set_cost` says beforehand
what that costs. NumPy only, no I/O."""

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from weakref import ref

import numpy as np

from service.core.diagnosis.stages import (
    STAGES,
    Setup,
    Stage,
    State,
    Trial,
    Unfit,
    heads_setup,
)
from service.core.errors import AttentionInputError
from service.core.types import Array

Given = Mapping[str, tuple[int, ...] | None]  # the caller's arrays: all heads (None) or some


def _recomputed(base: State, given: Given, s: Setup, trial: Trial, target: str) -> list[Stage]:
    """The stages :func:`recompute` runs for ``trial``: from the first step the mistakes change
    or the first after an array the caller gave, whichever comes first, to the target's; only
    those this computation has, a stage that reads no earlier step (the mask) only when the
    mistakes change it, and one that no later step reads only when it is the target. Empty
    when the mistakes leave the target alone."""
    on = stages_on(s)  # e.g. QK-norm before RoPE, or after
    last = next(i for i, stage in enumerate(on) if target in stage.names)
    changed = [i for i, stage in enumerate(on) if stage.mistakes & trial.mistakes]
    if not changed or changed[0] > last:
        return []
    after_given = [i + 1 for i, stage in enumerate(on) if set(stage.names) & set(given)]
    return [
        stage
        for stage in on[min([changed[0], *after_given]) : last + 1]
        if any(n in base for n in stage.names)  # a step this computation has
        and (stage.reads or stage.mistakes & trial.mistakes)  # else the base's is the same
        and (stage.feeds or target in stage.names)  # else nothing on the way reads it
    ]


_asked: list[tuple[ref[Setup], tuple[Stage, ...], tuple[Stage, ...]]] = []  # the last setup


def stages_on(s: Setup) -> tuple[Stage, ...]:
    """The stages of :data:`STAGES` this computation has on, kept for the setup asked last: a
    diagnosis asks for every set of mistakes it tries."""
    for asked, of, stages in _asked:
        if asked() is s and of is STAGES:
            return stages
    head = heads_setup(s)
    stages = tuple(stage for stage in STAGES if stage.on(head))
    _asked[:] = [(ref(s), STAGES, stages)]
    return stages


def _shared(stages: list[Stage], variants: Sequence[Trial]) -> int:
    """How many of ``stages`` the variants of one set of mistakes share: those before the
    first that reads a setting they differ in (the fully masked rows: the weights; a way of
    making a mistake: the stages naming it in their ``ways``)."""
    rows = len({t.rows for t in variants}) > 1
    ways = {code for code, _ in variants[0].ways if len({t.way(code) for t in variants}) > 1}
    return next(
        (
            i
            for i, stage in enumerate(stages)
            if (rows and "weights" in stage.names) or ways & stage.ways
        ),
        len(stages),
    )


def set_cost(base: State, given: Given, s: Setup, variants: Sequence[Trial], target: str) -> int:
    """The numbers recomputing one set of mistakes with all its variants makes
    (:func:`recomputations`): the arrays of the stages they share once, of the others once per
    variant, each as large as the base's (0 when no stage runs)."""
    stages = _recomputed(base, given, s, variants[0], target)
    k = _shared(stages, variants)

    def size(part: list[Stage]) -> int:
        return sum(base[n].size for stage in part for n in stage.names if n in base)

    return size(stages[:k]) + len(variants) * size(stages[k:])


def recomputations(
    base: State,
    given: Given,
    s: Setup,
    variants: Sequence[Trial],
    target: str,
    check: Callable[[], None] = lambda: None,
) -> Iterator[tuple[Trial, Array]]:
    """The ``target`` array recomputed under each variant of one set of mistakes (as
    :func:`recompute`; those that cannot happen here left out), the stages before the first
    one the variants differ in run once for all. ``check`` is called before each part."""
    stages = _recomputed(base, given, s, variants[0], target)
    if not stages:
        return
    k = _shared(stages, variants)
    world, seen = _world(base, s, variants[0])  # the variants share their mistakes
    check()
    shared = _run(dict(world), stages[:k], world, given, seen, variants[0], target)
    if shared is None:
        return
    for trial in variants:
        check()
        st = _run(dict(shared), stages[k:], world, given, seen, trial, target)
        made = None if st is None else _back(st[target], s, trial)
        del st  # one variant's arrays at a time
        if made is not None:
            yield trial, made


def recompute(
    base: State,
    given: Given,
    s: Setup,
    trial: Trial,
    target: str,
) -> Array | None:
    """The ``target`` array recomputed under ``trial``, from the first step the mistakes
    change or the first after an array the caller gave (``given``: a name's heads, or None
    for all of it), whichever comes first; the caller's arrays stay theirs, except the
    target. None when the mistakes cannot happen here or leave the target alone."""
    stages = _recomputed(base, given, s, trial, target)
    world, seen = _world(base, s, trial)
    st = _run(dict(world), stages, world, given, seen, trial, target) if stages else None
    return None if st is None else _back(st[target], s, trial)


def _world(base: State, s: Setup, trial: Trial) -> tuple[State, Setup]:
    """The arrays and setup the trial's steps run in: ours, or with batch and sequence
    swapped when the caller's layer took one for the other."""
    return batch_as_sequence(base, s) if "batch_as_sequence" in trial.mistakes else (base, s)


def _back(made: Array, s: Setup, trial: Trial) -> Array:
    """The target as computed in :func:`_world`, in our layout."""
    return swapped_back(made, s) if "batch_as_sequence" in trial.mistakes else made


def _run(
    st: State,
    stages: list[Stage],
    base: State,
    given: Given,
    s: Setup,
    trial: Trial,
    target: str,
) -> State | None:
    """``st`` with ``stages`` recomputed under ``trial`` in order, the caller's given parts
    kept (:func:`_keep_given`); None when the mistakes cannot happen here."""
    for stage in stages:
        try:
            with np.errstate(all="ignore"):
                made = stage.compute(st, s, trial)
        except (Unfit, AttentionInputError):
            return None
        for name, value in made.items():
            st[name] = _keep_given(value, base[name], given.get(name, ()), name == target)
    return st


def _keep_given(made: Array, base: Array, heads: tuple[int, ...] | None, target: bool) -> Array:
    """The recomputed array with the caller's given parts put back (never for the target)."""
    if target or heads == ():
        return made
    if heads is None or made.shape != base.shape:
        return base
    out = made.copy()
    out[:, list(heads)] = base[:, list(heads)]
    return out


def _swapped(a: Array, s: Setup) -> Array:
    """An array with its batch and sequence axes swapped: (B, h, L, ·) ↔ (L, h, B, ·) per
    head on /multihead, (B, L, ·) ↔ (L, B, ·) otherwise."""
    return a.swapaxes(0, 2) if s.num_heads is not None and a.ndim == 4 else a.swapaxes(0, 1)


def batch_as_sequence(st: State, s: Setup) -> tuple[State, Setup]:
    """The arrays and setup as a sequence-first layer sees a batch-first tensor
    (``nn.MultiheadAttention(batch_first=False)`` given (B, L, E)): its sequence is our batch
    and its batch our sequence. Only for computations whose steps before the scores work
    token by token (no mask, RoPE, position bias or sinks, L = S): :func:`swapped_back` undoes
    it for the array compared."""
    world = {name: _swapped(a, s) for name, a in st.items()}
    x_in, context = s.x_in, s.context
    return world, replace(
        s,
        x_in=None if x_in is None else x_in.swapaxes(0, 1),  # (L, B, d_model)
        context=None if context is None else context.swapaxes(0, 1),
        batch=s.seq_len,
        seq_len=s.batch,
        ctx_len=s.batch,
    )


def swapped_back(a: Array, s: Setup) -> Array:
    """An array computed in :func:`batch_as_sequence`'s world, in ours (``s``: our setup)."""
    return _swapped(a, s)
