"""DOWNPOUR (Dean et al., NIPS 2012) in delta mode."""

from __future__ import annotations

from elephant.optimizers.base import DistributedOptimizer
from elephant.optimizers.helpers import NAMED_RULES_SECTION, see_docs, tree_map
from elephant.optimizers.registry import register


@register
class Downpour(DistributedOptimizer):
    """Asynchronous SGD that adds each worker's accumulated delta to the center.

    Worker: after ``num_steps ≤ window`` local steps from the pulled center
    ``θ_pull`` to ``θ``, send ``Δ = θ − θ_pull``; adopt the center of the reply.

    Server (one commit): ``θ̃ ← θ̃ + Δ``. Staleness is not corrected, so the
    number of workers and the window must stay small (a handful of workers,
    a few steps); see :class:`~elephant.optimizers.DynSGD`,
    :class:`~elephant.optimizers.AGN` and :class:`~elephant.optimizers.ADAG` for
    rules that tame it. With one worker the center follows sequential training.

    Modes: ``"asynchronous"`` and ``"hogwild"``.

    The default window is one step. A delta that another worker's commits
    overtook is added whole all the same, and with the user's momentum or Adam
    running on every replica the stale deltas overshoot: windows of 5 steps
    (dist-keras' default) and of 2 end far behind plain Keras, further with
    more workers, where windows of one step keep up on most workloads
    (docs/convergence.md, "Named rules at their default window").
    ``setup_warning`` says so when the staleness of a delta in local steps,
    ``(K − 1)·window``, reaches 4.

    Args:
        window: local steps per commit. Default 1.
        staleness_bound: optional SSP bound; default None (unbounded).

    Reference: J. Dean et al., "Large Scale Distributed Deep Networks", NIPS 2012
    (the paper pushes gradients to an Adagrad server; this is the delta form
    dist-keras implemented).
    """

    name = "downpour"
    modes = ("asynchronous", "hogwild")
    default_window = 1
    elementwise = True

    def setup_warning(self, window, num_workers, batch_split):
        if num_workers > 1 and window is None:
            return (
                f"DOWNPOUR adds every worker's whole-partition delta to the center, so with {num_workers} workers and "
                f"frequency='epoch' the center moves about {num_workers} times as far as one worker did and "
                "oscillates, far behind plain Keras. Use the asynchronous default (optimizer=None, DelayedNesterov) or "
                f"DOWNPOUR's default window of one step {see_docs(NAMED_RULES_SECTION)}."
            )
        if window is not None and window > 1 and (num_workers - 1) * window >= 4:
            return (
                f"DOWNPOUR with a window of {window} steps and {num_workers} workers adds deltas that are "
                f"{(num_workers - 1) * window} local steps stale on average, whole; with the compiled optimizer's "
                "momentum they overshoot, and the fit ends behind plain Keras, further with more workers. Use window=1 "
                f"(DOWNPOUR's default) or the asynchronous default, optimizer=None {see_docs(NAMED_RULES_SECTION)}."
            )
        return super().setup_warning(window, num_workers, batch_split)

    def apply(self, state, center, clock, worker, commit):
        return tree_map(lambda c, d: c + d, center, commit.tensors), None, state
