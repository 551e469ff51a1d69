"""The fit-start warnings: settings known to train worse than plain Keras, each pointing to its figures.

:meth:`~elephant.fit.plan.FitPlan.warnings` gathers them with the rule's own
``setup_warning``. Each says what is risky and what to do, and ends with the
section of docs/convergence.md that holds the measurements.
"""

from __future__ import annotations

from elephant.optimizers.base import DistributedOptimizer
from elephant.optimizers.local import MAX_SCALED_WORKERS

__all__ = ["async_window_warning", "block_momentum_warning", "overlap_warning"]


def _see(section: str) -> str:
    """The pointer a warning ends with: the section of docs/convergence.md that holds its figures."""
    return f'(see docs/convergence.md, "{section}")'


#: The sections of docs/convergence.md the fit-start warnings point to.
OVERLAP_SECTION = "Commits in flight (SparkModel(overlap=True))"
BLOCK_MOMENTUM_SECTION = "Windows at 8 or more workers"
ASYNC_HEAD_SECTION = "Where the defaults stand"
ASYNC_RAMPED_SECTION = "Measured on Spark, 4 and 8 workers (3 seeds)"
ASYNC_SCALED_SECTION = "The workers' rate under an adaptive optimizer"


def overlap_warning(overlap: bool, mode: str, window: int | None, num_workers: int) -> str | None:
    """The fit-start warning for ``overlap=True`` where it costs accuracy, else None: synchronous rounds at 4 or more
    workers, and windows shorter than 5 steps."""
    if not overlap or num_workers < 2:
        return None
    if mode == "synchronous" and num_workers >= 4:
        return (
            f"overlap=True in synchronous mode with {num_workers} workers: the steps taken while a round closes "
            "start from weights that miss that round's average, which costs accuracy against blocking rounds. "
            f"Use overlap=False or fewer workers {_see(OVERLAP_SECTION)}."
        )
    if window is not None and window < 5:
        return (
            f"overlap=True with a window of {window} steps: each delta then misses the center updates of one more "
            "flight, which doubles the staleness of a short window and lets momentum overshoot. Use a window of 5 "
            f"steps or more, or overlap=False {_see(OVERLAP_SECTION)}."
        )
    return None


def block_momentum_warning(rule: DistributedOptimizer, adaptive: bool, num_workers: int,
                           window: int | None) -> str | None:
    """The fit-start warning for the default block momentum at 8 or more workers under an adaptive optimizer, else None.

    Only fits that commit in windows of steps are warned; ``window`` is the fit's (None: one commit per pass).
    """
    outer = getattr(rule, "outer", None)  # the rules with an outer step (model averaging, DelayedNesterov)
    if outer is None or outer.momentum is not None or not adaptive or num_workers < 8 or window is None:
        return None
    beta = outer.resolve_momentum(num_workers)
    return (
        f"{type(rule).__name__} with block momentum {beta:g} at {num_workers} workers and an adaptive local "
        f"optimizer: its steady step is {1 / (1 - beta):g} times the workers' mean progress, and the first epochs "
        "end behind plain Keras. Check the first epochs against a short plain Keras run, train more epochs or use "
        f"fewer workers {_see(BLOCK_MOMENTUM_SECTION)}."
    )


#: The most workers at which the asynchronous default, its rate scaled and ramped (or started by the driver's
#: head), is known to catch up with plain Keras by the end of a second epoch: up to it, only one-epoch fits are
#: warned about; beyond it, two-epoch fits too (docs/convergence.md, "Measured on Spark, 4 and 8 workers (3 seeds)").
TWO_EPOCHS_HELD_WORKERS = 8


def async_window_warning(rule: DistributedOptimizer, adaptive: bool, num_workers: int,
                         window: int | None, epochs: int | None = None, warmup_window: int | None = None,
                         head: bool = False) -> str | None:
    """The fit-start warning for asynchronous windows at 4 or more workers under an adaptive optimizer, else None.

    Warned: the asynchronous default (DelayedNesterov) committing in windows (``window`` not None; one commit per
    pass is left alone) under an adaptive optimizer at 4 or more workers. Where its workers train at a scaled rate
    the first epoch is the one that trails plain Keras up to :data:`TWO_EPOCHS_HELD_WORKERS` workers when the rate
    ramps up or the driver trains a head (``head``: ``FitPlan.head_steps``), and the first two elsewhere, so a fit
    of more ``epochs`` (None: unknown) is not warned; at the compiled rate every fit is. The warning says which of
    these cases the fit is in (a head, the first epoch's shorter windows while the rate ramps: ``warmup_window``,
    or a window fixed throughout) and points to the section of docs/convergence.md that holds its figures.
    """
    if rule.name != "delayednesterov" or not adaptive or num_workers < 4 or window is None:
        return None
    scaled = bool(getattr(rule, "sqrt_scaling", None))
    ramped = num_workers > MAX_SCALED_WORKERS  # sqrt(K), ramped up over the first epoch
    # the epochs that trail plain Keras: the first one where the rate ramps or a head starts it, up to 8 workers
    behind = 1 if num_workers <= TWO_EPOCHS_HELD_WORKERS and (ramped or head) else 2
    if scaled and epochs is not None and epochs > behind:
        return None
    if not scaled:
        return (
            f"Asynchronous windows at {num_workers} workers with an adaptive local optimizer at its compiled rate: "
            "the first epoch ends far behind plain Keras and the second still behind, where the synchronous default "
            "catches up. For fits of one or two epochs prefer mode='synchronous', or check the first epochs against "
            f"a short plain Keras run {_see(ASYNC_RAMPED_SECTION)}."
        )
    first = "the first epoch" if behind == 1 else "the first two epochs"
    fits = "one-epoch fits" if behind == 1 else "fits of one or two epochs"
    if head:
        how, section = f"after the driver's head, {first} can still end behind plain Keras", ASYNC_HEAD_SECTION
    elif not ramped:  # 4 workers, no head: the first two epochs
        how, section = ("without a head on the driver, the first epoch can end several points behind plain Keras and "
                        "the second just behind, further than the synchronous default's", ASYNC_SCALED_SECTION)
    elif warmup_window is not None:
        how, section = (f"without a head on the driver the rate ramps up over the first epoch, and {first} can end "
                        "several points behind plain Keras, further than the synchronous default's",
                        ASYNC_RAMPED_SECTION)
    else:
        how, section = ("without a head on the driver and with a window fixed for every epoch (no shorter windows "
                        f"while the rate ramps up), {first} can end far behind plain Keras, further than the "
                        "synchronous default's", ASYNC_RAMPED_SECTION)
    return (
        f"Asynchronous windows at {num_workers} workers with an adaptive local optimizer at sqrt({num_workers}) "
        f"times its rate: {how}. For {fits} prefer mode='synchronous', or check {first} against a short plain "
        f"Keras run {_see(section)}."
    )

