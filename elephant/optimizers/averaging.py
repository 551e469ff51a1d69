"""Synchronous model averaging / Local SGD (Stich 2019)."""

from __future__ import annotations

from elephant import weights as W
from elephant.errors import ConfigError
from elephant.optimizers.base import DistributedOptimizer, register, tree_map


@register
class ModelAveraging(DistributedOptimizer):
    """Synchronous rounds: the center moves by the sample-weighted mean delta.

    Worker: after ``window`` local steps (the period ``H``) send
    ``Δᵏ = θᵏ − θ̃``; wait for the round; adopt the new center.

    Server, one round over the workers that trained (``num_samples > 0``)::

        θ̃ ← θ̃ + Σₖ wₖ Δᵏ        with wₖ = samplesₖ / Σⱼ samplesⱼ

    A worker that trained nothing contributes nothing (it does not dilute the
    mean). Since every worker of a round started from the same center, this is
    the sample-weighted mean of the workers' weights; with equal shards and
    ``window=1`` it is synchronous mini-batch SGD. Deltas are summed in worker
    order, so the result does not depend on the order commits arrived in.
    Note the difference from DOWNPOUR under a barrier, which would *sum* them.

    Mode: ``"synchronous"``.

    Args:
        window: local steps per round (``H``). Default 8 (no canonical value;
            ``window=1`` is mini-batch SGD, larger saves communication).

    Reference: S. U. Stich, "Local SGD Converges Fast and Communicates Little",
    ICLR 2019; T. Lin et al., "Don't Use Large Mini-Batches, Use Local SGD", ICLR 2020.
    """

    name = "modelaveraging"
    aliases = ("averaging", "model_averaging", "localsgd")
    modes = ("synchronous",)
    default_window = 8

    def apply_round(self, state, center, clock, commits):
        trained = [c for _, c in sorted(commits.items()) if c.num_samples > 0]
        replies = {k: None for k in commits}
        if not trained:
            return center, replies, state
        mean_delta = W.weighted_mean([c.tensors for c in trained], [c.num_samples for c in trained])
        return tree_map(lambda c, d: c + d, center, mean_delta), replies, state


def post_local_sgd_step(step: int, warmup: int, period: int) -> bool:
    """Whether PyTorch's post-local SGD averages after optimizer step ``step`` (from 0).

    During the first ``warmup`` steps every step is synchronised (mini-batch SGD);
    afterwards the models are averaged when ``(step − warmup) % period == 0``.
    Use it to script a post-local SGD schedule for :func:`~elephant.optimizers.simulate`.

    Raises:
        ConfigError: ``warmup`` is negative or ``period`` is not positive.
    """
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"`warmup` must be an int >= 0; received warmup={warmup!r}")
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        raise ConfigError(f"`period` must be a positive int; received period={period!r}")
    if step < warmup:
        return True
    return (step - warmup) % period == 0
