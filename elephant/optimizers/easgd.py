"""Elastic averaging: EASGD (synchronous), AEASGD and EAMSGD (asynchronous).

Zhang, Choromanska, LeCun, "Deep learning with Elastic Averaging SGD",
NeurIPS 2015, arXiv:1412.6651.

Workers are tied to the center by a spring instead of being overwritten by it:
an exchange moves the worker and the center towards each other by the same
elastic term ``E = α(θᵏ − θ̃)``, so ``θᵏ + θ̃`` is conserved, and the worker keeps
its own weights between exchanges.
"""

from __future__ import annotations

import logging

import numpy as np

from elephant.errors import ConfigError
from elephant.optimizers.base import DistributedOptimizer
from elephant.optimizers.helpers import NAMED_RULES_SECTION, check_number, see_docs, tree_map
from elephant.optimizers.local import local_setting
from elephant.optimizers.registry import register

logger = logging.getLogger(__name__)

#: ``alpha=None`` means ``DEFAULT_BETA / num_workers`` (the paper's β = pα = 0.9).
DEFAULT_BETA = 0.9


def _moving_rate(alpha, rho, learning_rate) -> float | None:
    """α from ``alpha`` or from dist-keras' ``rho * learning_rate``; None = 0.9 / n."""
    if rho is None and learning_rate is None:
        return None if alpha is None else check_number("alpha", alpha, low=0.0, high=1.0)
    if alpha is not None:
        raise ConfigError(
            "give either `alpha` or `rho` with `learning_rate` (alpha = rho * learning_rate), not both; "
            f"received alpha={alpha!r}, rho={rho!r}, learning_rate={learning_rate!r}"
        )
    if rho is None or learning_rate is None:
        raise ConfigError(
            "`rho` and `learning_rate` go together (alpha = rho * learning_rate); "
            f"received rho={rho!r}, learning_rate={learning_rate!r}"
        )
    alpha = check_number("rho", rho, low=0.0) * check_number("learning_rate", learning_rate, low=0.0, low_open=True)
    if alpha > 1.0:
        raise ConfigError(
            "the moving rate alpha = rho * learning_rate must be in [0, 1]; "
            f"received rho={rho!r}, learning_rate={learning_rate!r} (alpha={alpha!r})"
        )
    return alpha


class _Elastic(DistributedOptimizer):
    """The elastic worker rule shared by the family: send θᵏ, then θᵏ ← θᵏ − E.

    The center is a moving average of the workers, so, as with model averaging,
    ``SparkModel`` splits the batch among the workers by default (``splits_batch``).

    Progress scaling: an exchange conserves the sum of the center and the
    ``K`` workers, so the ``K + 1`` bodies share what the workers' gradient steps
    added and, in steady state, all move at ``K/(K + 1)`` of one worker's speed
    (2/3 with two workers). With ``progress_scale = g`` a worker extrapolates its
    window's progress before the exchange, sending ``θ₀ + g·(θᵏ − θ₀)`` (``θ₀``:
    its weights after the last exchange) and keeping that point; ``g = (K + 1)/K``
    gives the center back its share. ``g = 1`` is the paper's rule.
    """

    splits_batch = True
    elementwise = True

    def __init__(self, window=None, alpha=None, *, rho=None, learning_rate=None, staleness_bound=None,
                 progress_scale=None):
        super().__init__(window=window, staleness_bound=staleness_bound)
        self.alpha = _moving_rate(alpha, rho, learning_rate)
        self.progress_scale = None if progress_scale is None else check_number(
            "progress_scale", progress_scale, low=0.0, low_open=True)

    def for_fit(self, local, num_workers, batch_split, window):
        if self.progress_scale is not None:
            return self
        workers = max(int(num_workers), 1)
        return type(self).from_config({**self.get_config(), "progress_scale": (workers + 1) / workers})

    def describe(self, num_workers):
        g = self.progress_scale
        if g is None or g == 1.0:
            return repr(self)
        return (f"{self!r}; each worker's window progress is extrapolated by {g:.4g} before the exchange, "
                "which shares it with the center (progress_scale=1 is the paper's rule)")

    def worker_init(self, center):
        return {"start": tree_map(np.copy, center), "offset": None}

    def make_commit(self, state, weights, pulled, num_steps):
        g = 1.0 if self.progress_scale is None else self.progress_scale
        if g == 1.0:
            return tree_map(np.copy, weights), state
        start = (state or {}).get("start", pulled)
        sent = tree_map(lambda w, s: s + g * (w - s), weights, start)
        return sent, {"start": start, "offset": tree_map(lambda x, w: x - w, sent, weights)}

    def on_reply(self, state, weights, reply):
        # ``weights`` are the local weights now; the extrapolation offset is added to them
        offset = (state or {}).get("offset")
        if offset is not None:
            weights = tree_map(lambda w, o: w + o, weights, offset)
        if reply.tensors is not None:
            weights = tree_map(lambda w, e: w - e, weights, reply.tensors)
        return weights, {"start": tree_map(np.copy, weights), "offset": None}

    def setup_warning(self, window, num_workers, batch_split):
        base = super().setup_warning(window, num_workers, batch_split)
        if base is not None or num_workers < 2:
            return base
        if self.progress_scale is not None and self.progress_scale <= 1.0:
            return (
                f"{type(self).__name__} with progress_scale={self.progress_scale:g} trails plain training at equal "
                "epochs, further with more workers: an exchange conserves the sum of the center and the workers, so "
                "the center is one more body sharing the workers' progress. Keep progress_scale=None, or use the "
                f"mode's default, optimizer=None {see_docs(NAMED_RULES_SECTION)}."
            )
        if num_workers >= 4:
            return (
                f"{type(self).__name__} with {num_workers} workers: with the batch split among them an adaptive local "
                "optimizer's (Adam, RMSprop...) steps are noisier, and the elastic exchange does not make that up, so "
                "the fit falls behind plain Keras at equal epochs (momentum SGD keeps up). For parity use the mode's "
                f"default (optimizer=None) or train more epochs {see_docs(NAMED_RULES_SECTION)}."
            )
        return None

    def server_init(self, center, num_workers):
        """The server state is the resolved moving rate α."""
        return DEFAULT_BETA / max(int(num_workers), 1) if self.alpha is None else self.alpha

    def get_config(self):
        return {**super().get_config(), "alpha": self.alpha, "progress_scale": self.progress_scale}


@register
class EASGD(_Elastic):
    """Synchronous elastic averaging.

    Worker: train ``window`` local steps, send its weights ``Wᵏ`` (never reset to
    the center), wait for the round, then apply ``Wᵏ ← Wᵏ − Eᵏ``.

    Server, one round over the workers that trained (``num_samples > 0``)::

        Eᵏ = α (Wᵏ − θ̃)            for each such worker
        θ̃ ← θ̃ + Σₖ Eᵏ  = (1 − β) θ̃ + β · meanₖ Wᵏ      with β = pα over p workers

    and replies ``Eᵏ`` to worker ``k`` (zeros to a worker that trained nothing,
    which therefore neither pulls the center nor moves). α = 0 gives independent
    workers; β = 1 sets the center to the workers' mean.

    Mode: ``"synchronous"``.

    Args:
        window: local steps per round (the paper's communication period τ).
            Default 32 (dist-keras' EASGD-family default).
        alpha: moving rate α in [0, 1]. Default None = ``0.9 / num_workers``
            (β = 0.9, as in the paper's experiments), resolved by the server.
        rho, learning_rate: dist-keras parity, ``alpha = rho * learning_rate``
            (dist-keras' trainer used ``rho=5.0, learning_rate=0.1``, α = 0.5).
            Give both or neither, and not together with ``alpha``.
        progress_scale: ``g`` > 0, the factor on a worker's window progress
            before an exchange (see :class:`_Elastic`). Default None = ``(K + 1)/K``
            for ``K`` workers, resolved at the start of a fit; 1 is the paper's rule.

    Raises:
        ConfigError: a hyper-parameter is out of range or they are combined wrongly.
    """

    name = "easgd"
    modes = ("synchronous",)
    default_window = 32

    def server_init(self, center, num_workers):
        alpha = super().server_init(center, num_workers)
        if alpha * num_workers > 1:
            logger.warning(
                "EASGD alpha=%g with %d workers gives beta=%g > 1: the center overshoots the workers' mean",
                alpha, num_workers, alpha * num_workers,
            )
        return alpha

    def apply_round(self, state, center, clock, commits):
        alpha = state
        elastic = {
            k: tree_map(lambda w, c: alpha * (w - c), c.tensors, center) if c.num_samples > 0 else None
            for k, c in sorted(commits.items())
        }
        new_center = center
        for term in elastic.values():
            if term is not None:
                new_center = tree_map(lambda c, e: c + e, new_center, term)
        zeros = [np.zeros_like(c) for c in center]
        return new_center, {k: zeros if e is None else e for k, e in elastic.items()}, state


@register
class AEASGD(_Elastic):
    """Asynchronous elastic averaging with an atomic exchange.

    Worker: train ``window`` local steps, send its weights ``Wᵏ`` (never reset to
    the center), then apply ``Wᵏ ← Wᵏ − E`` with the ``E`` of the reply.

    Server (one commit, one critical section)::

        E = α (Wᵏ − θ̃)
        θ̃ ← θ̃ + E                 reply E

    Computing ``E`` from the center it is added to (dist-keras pulled and
    committed in two messages, so another commit could land in between) keeps
    ``Wᵏ + θ̃`` exactly conserved by an exchange. The local gradient steps use
    the model's compiled Keras optimizer, evaluated at the post-exchange weights.

    Modes: ``"asynchronous"`` and ``"hogwild"``.

    Args:
        window: local steps per exchange (the paper's τ). Default 32.
        alpha: moving rate α in [0, 1]. Default None = ``0.9 / num_workers``
            (resolved by the server; dist-keras' α = 0.5 pulls hard with many workers).
        rho, learning_rate: dist-keras parity, ``alpha = rho * learning_rate``
            (its trainer default ``rho=5.0, learning_rate=0.1`` is α = 0.5).
            Give both or neither, and not together with ``alpha``.
        staleness_bound: optional SSP bound; default None (unbounded).
        progress_scale: ``g`` > 0, the factor on a worker's window progress
            before an exchange (see :class:`_Elastic`). Default None = ``(K + 1)/K``
            for ``K`` workers, resolved at the start of a fit; 1 is the paper's rule.

    Raises:
        ConfigError: a hyper-parameter is out of range or they are combined wrongly.
    """

    name = "aeasgd"
    modes = ("asynchronous", "hogwild")
    default_window = 32

    def apply(self, state, center, clock, worker, commit):
        alpha = state
        elastic = tree_map(lambda w, c: alpha * (w - c), commit.tensors, center)
        return tree_map(lambda c, e: c + e, center, elastic), elastic, state


@register
class EAMSGD(AEASGD):
    """AEASGD whose workers take Nesterov momentum steps locally.

    The exchange is exactly :class:`AEASGD`'s. The momentum lives in the local
    optimizer, so compile the model with ``keras.optimizers.SGD(learning_rate,
    momentum=δ, nesterov=True)`` — :meth:`local_optimizer` builds it from this
    rule's ``momentum``. (Keras' Nesterov stores the look-ahead iterate, so its
    trace equals the paper's Algorithm 2 up to that change of variables.)

    Modes: ``"asynchronous"`` and ``"hogwild"``.

    Args:
        window: local steps per exchange. Default 32.
        alpha: moving rate; default None = ``0.9 / num_workers``.
        momentum: Nesterov momentum δ in [0, 1) for the local optimizer.
            Default 0.9 (dist-keras; the paper's experiments used 0.99).
        rho, learning_rate: dist-keras parity, ``alpha = rho * learning_rate``.
        staleness_bound: optional SSP bound; default None (unbounded).
        progress_scale: ``g`` > 0, the factor on a worker's window progress
            before an exchange (see :class:`_Elastic`). Default None = ``(K + 1)/K``
            for ``K`` workers, resolved at the start of a fit; 1 is the paper's rule.

    Raises:
        ConfigError: a hyper-parameter is out of range or they are combined wrongly.
    """

    name = "eamsgd"

    def __init__(self, window=None, alpha=None, momentum=0.9, *, rho=None, learning_rate=None, staleness_bound=None,
                 progress_scale=None):
        super().__init__(window, alpha, rho=rho, learning_rate=learning_rate, staleness_bound=staleness_bound,
                         progress_scale=progress_scale)
        self.momentum = check_number("momentum", momentum, low=0.0, high=1.0, high_open=True)

    def local_optimizer_mismatch(self, local):
        kind, momentum = type(local).__name__, local_setting(local, "momentum")
        if kind != "SGD" or not getattr(local, "nesterov", False) or momentum != self.momentum:
            return (f"EAMSGD's momentum lives in the local optimizer, but the model is compiled with {kind} "
                    f"(momentum={momentum}, nesterov={getattr(local, 'nesterov', None)}), so momentum="
                    f"{self.momentum} has no effect; compile with EAMSGD.local_optimizer(learning_rate)")
        return None

    def local_optimizer(self, learning_rate: float = 0.01):
        """The Keras optimizer to compile the model with: ``SGD(lr, momentum, nesterov=True)``.

        Args:
            learning_rate: local learning rate η. Default 0.01 (Keras' SGD default).
        """
        import keras  # deferred: importing elephant.optimizers must not load TensorFlow

        return keras.optimizers.SGD(learning_rate=learning_rate, momentum=self.momentum, nesterov=True)

    def get_config(self):
        return {**super().get_config(), "momentum": self.momentum}
