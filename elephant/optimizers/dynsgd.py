"""DynSGD: staleness-scaled deltas (Jiang et al., SIGMOD 2017, as formulated by Hermans)."""

from __future__ import annotations

from elephant.optimizers.agn import SqrtScaling, check_sqrt_scaling
from elephant.optimizers.base import DistributedOptimizer
from elephant.optimizers.helpers import staleness, tree_map
from elephant.optimizers.registry import register


@register
class DynSGD(SqrtScaling, DistributedOptimizer):
    """Asynchronous delta exchange that divides each delta by its staleness plus one.

    Worker: after ``num_steps`` local steps send ``Δ = θ − θ_pull`` (not
    normalised) together with the clock ``c_k`` of the center it started from
    (``Commit.base_clock``); adopt the center of the reply.

    Server (one commit, at clock ``c``):

        τ = c − c_k          (commits applied since the worker's window started)
        θ̃ ← θ̃ + Δ / (τ + 1)
        c ← c + 1

    The clock is advanced by the runtime inside the same critical section, so τ
    is exact (dist-keras read it outside its lock). With one worker τ ≡ 0 and
    DynSGD is DOWNPOUR. In a homogeneous cluster ``E[τ] ≈ n − 1``, so each
    commit moves the center by about ``1/n`` of a worker's progress: DynSGD
    averages, and ``SparkModel`` splits the batch among the workers for it
    (``splits_batch``), which trains better than full batches per worker
    (docs/convergence.md, "Named rules at their default window"). When the model's
    optimizer is adaptive (Adam, RMSprop...), each delta is also multiplied by
    ``√n`` by default (``sqrt_scaling``, see
    :class:`~elephant.optimizers.agn.SqrtScaling`).

    Modes: ``"asynchronous"`` and ``"hogwild"`` (in hogwild the clock itself is
    racy, so τ is approximate).

    Args:
        window: local steps per commit. Default 5 (dist-keras' trainer default).
        staleness_bound: optional SSP bound; default None (unbounded).
        sqrt_scaling: as :class:`~elephant.optimizers.AGN`'s (``√n`` on each
            delta for an adaptive local optimizer with the batch split).

    Reference: J. Jiang, B. Cui, C. Zhang, L. Yu, "Heterogeneity-aware
    Distributed Parameter Servers", SIGMOD 2017 (this ``1/(τ+1)`` form is the
    one in J. Hermans' thesis and dist-keras, not the paper's version-based
    bookkeeping).
    """

    name = "dynsgd"
    modes = ("asynchronous", "hogwild")
    default_window = 5
    elementwise = True
    splits_batch = True
    averaging_shortfall = "most on a Conv1D trained with momentum SGD"

    def __init__(self, window=None, staleness_bound=None, sqrt_scaling=None):
        super().__init__(window=window, staleness_bound=staleness_bound)
        self.sqrt_scaling = check_sqrt_scaling(sqrt_scaling)

    def server_init(self, center, num_workers):
        return {"gain": self.gain(num_workers)}

    def apply(self, state, center, clock, worker, commit):
        scale = (state or {}).get("gain", 1.0) / (staleness(clock, commit) + 1)
        return tree_map(lambda c, d: c + scale * d, center, commit.tensors), None, state

    def get_config(self):
        return {**super().get_config(), "sqrt_scaling": self.sqrt_scaling}
