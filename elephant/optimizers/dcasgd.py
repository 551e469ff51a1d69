"""DC-ASGD, delay-compensated asynchronous SGD (Zheng et al., ICML 2017)."""

from __future__ import annotations

import dataclasses

import numpy as np

from elephant.errors import ConfigError
from elephant.optimizers.base import DistributedOptimizer
from elephant.optimizers.helpers import check_number, tree_map
from elephant.optimizers.registry import register
from elephant.optimizers.local import local_setting

Weights = list[np.ndarray]


@dataclasses.dataclass(frozen=True)
class DCASGDState:
    """Server state: per-worker backups ``w_bak[k]`` and, adaptive variant only, MeanSquare."""

    backups: dict[int, Weights] = dataclasses.field(default_factory=dict)
    mean_square: Weights | None = None


@register
class DCASGD(DistributedOptimizer):
    """Asynchronous SGD that corrects each stale gradient with a cheap Hessian term.

    Gradients from deltas: the runtime trains with the model's compiled Keras
    optimizer and never ships raw gradients, so the worker sends
    ``Δ = θ − θ_pull`` and the server recovers the mean gradient of the window
    as ``g = −Δ / (η·m)`` with ``m = num_steps`` and ``η = learning_rate``. This
    is exact when the model is compiled with ``keras.optimizers.SGD(η)`` (no
    momentum) and ``window=1``: then ``Δ = −η·g``. Keep ``learning_rate`` equal
    to that SGD learning rate.

    Server: keeps ``w_bak[k]``, the center worker ``k`` last received (on its pull
    and on every commit reply), and applies one commit as::

        g̃ = g + λ · g ⊙ g ⊙ (θ̃ − w_bak[k])      (g ⊙ g approximates the Hessian's diagonal)
        θ̃ ← θ̃ − η·m · g̃                           (= θ̃ + Δ − η·m·λ · g ⊙ g ⊙ (θ̃ − w_bak[k]))

    DC-ASGD-c uses a constant ``λ = lambda_dc``. DC-ASGD-a (``adaptive=True``)
    uses ``λ = lambda_dc / sqrt(MS + ε)`` element-wise with
    ``MS ← decay·MS + (1 − decay)·g ⊙ g`` updated before use (MS starts at 0).
    A fresh commit (``θ̃ = w_bak[k]``) is a plain SGD step, so with one worker,
    or with ``lambda_dc=0``, DC-ASGD is DOWNPOUR. Backups are per worker, as in
    the paper (MXNet keeps a single "previous weight" instead).

    Server state: one model copy per worker (+ one for MS); asynchronous mode only.

    Args:
        window: local steps per commit. Default 1 (the algorithm's setting).
        learning_rate: η of the workers' local SGD. Default 0.01 (the default of
            ``keras.optimizers.SGD``); it must match the compiled optimizer.
        lambda_dc: variance-control parameter λ (λ₀ if adaptive), ``>= 0``.
            Default 0.04 (MXNet's ``DCASGD(lamda=0.04)``).
        adaptive: use DC-ASGD-a. Default False.
        decay: MeanSquare momentum in [0, 1) (adaptive only). Default 0.95.
        epsilon: MeanSquare floor ``> 0`` (adaptive only). Default 1e-7.
        staleness_bound: optional SSP bound; default None (unbounded).

    Raises:
        ConfigError: a hyper-parameter is out of range.

    Reference: S. Zheng, Q. Meng, T. Wang, W. Chen, N. Yu, Z.-M. Ma, T.-Y. Liu,
    "Asynchronous Stochastic Gradient Descent with Delay Compensation", ICML 2017,
    arXiv:1609.08326.
    """

    name = "dcasgd"
    modes = ("asynchronous",)
    default_window = 1
    elementwise = True

    def __init__(self, window=None, learning_rate=0.01, lambda_dc=0.04, adaptive=False, decay=0.95,
                 epsilon=1e-7, staleness_bound=None):
        super().__init__(window=window, staleness_bound=staleness_bound)
        self.learning_rate = check_number("learning_rate", learning_rate, low=0.0, low_open=True)
        self.lambda_dc = check_number("lambda_dc", lambda_dc, low=0.0)
        if not isinstance(adaptive, bool):
            raise ConfigError(f"`adaptive` must be True or False; received adaptive={adaptive!r}")
        self.adaptive = adaptive
        self.decay = check_number("decay", decay, low=0.0, high=1.0, high_open=True)
        self.epsilon = check_number("epsilon", epsilon, low=0.0, low_open=True)

    def local_optimizer_mismatch(self, local):
        kind, lr = type(local).__name__, local_setting(local, "learning_rate")
        if kind != "SGD" or local_setting(local, "momentum") or lr != self.learning_rate:
            return (f"DC-ASGD recovers gradients as -delta / learning_rate, exact only with plain SGD at "
                    f"learning_rate={self.learning_rate}; the model is compiled with {kind}(learning_rate={lr}), "
                    "so the delay compensation is approximate")
        return None

    def server_init(self, center, num_workers):
        return DCASGDState(mean_square=[np.zeros_like(c) for c in center] if self.adaptive else None)

    def on_pull(self, state, center, clock, worker):
        return dataclasses.replace(state, backups={**state.backups, worker: tree_map(np.copy, center)})

    def apply(self, state, center, clock, worker, commit):
        step = self.learning_rate * max(int(commit.num_steps), 1)  # η·m
        grad = tree_map(lambda d: -d / step, commit.tensors)
        mean_square = state.mean_square
        if self.adaptive:
            mean_square = tree_map(lambda ms, g: self.decay * ms + (1 - self.decay) * g * g, mean_square, grad)
            lam = [self.lambda_dc / np.sqrt(ms + self.epsilon) for ms in mean_square]
        else:
            lam = [self.lambda_dc] * len(center)
        backup = state.backups.get(worker, center)
        new_center = tree_map(
            lambda c, d, g, b, lm: c + d - step * lm * g * g * (c - b), center, commit.tensors, grad, backup, lam
        )
        backups = {**state.backups, worker: tree_map(np.copy, new_center)}
        return new_center, None, DCASGDState(backups=backups, mean_square=mean_square)

    def get_config(self):
        return {
            **super().get_config(),
            "learning_rate": self.learning_rate,
            "lambda_dc": self.lambda_dc,
            "adaptive": self.adaptive,
            "decay": self.decay,
            "epsilon": self.epsilon,
        }
