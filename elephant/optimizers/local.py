"""What a rule may read of the user's compiled Keras optimizer: duck-typed, so nothing imports Keras.

A rule's ``for_fit`` adapts itself to the local optimizer the workers train
with (AGN scales by the square root of the workers for an adaptive one; DC-ASGD
and the EASGD family read its learning rate). These helpers read what they
need from the object's class names and attributes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from elephant.errors import ConfigError

__all__ = ["ADAPTIVE_OPTIMIZERS", "FIRST_MOMENTS", "MAX_ASYNC_LAG", "SECOND_MOMENTS", "LocalMoment", "LocalMomentum",
           "ScaledLocalRate", "adapts_step_size", "asynchrony_lag", "check_sqrt_scaling", "inner_optimizer",
           "lag_window", "local_setting", "ramped_rates", "settable_rate", "step_rates"]


#: Keras optimizers that divide each step by a running magnitude of the gradient (or
#: take its sign), so that a smaller batch gives noisier steps but not smaller ones.
ADAPTIVE_OPTIMIZERS = frozenset(
    {"Adam", "AdamW", "Adamax", "Nadam", "RMSprop", "Adagrad", "Adadelta", "Adafactor", "Ftrl", "Lion", "Lamb"}
)


#: Keras optimizers whose running magnitude of the gradient decays at a rate set by one hyperparameter, which
#: the workers' copy may spread over more steps (:class:`LocalMoment`): its name, and whether the optimizer
#: corrects the magnitude's start from zero (Adam's ``1 − beta_2^t``; RMSprop does not). Matched on the class
#: and its bases' names, so a subclass of ``Adam`` counts.
SECOND_MOMENTS = {"RMSprop": ("rho", False), "Adam": ("beta_2", True), "AdamW": ("beta_2", True),
                  "Nadam": ("beta_2", True)}

#: Keras optimizers whose steps follow a running mean of the gradient that decays at the rate of one
#: hyperparameter and is corrected for its start from zero by ``1 − decay^t`` (Adam's ``beta_1``), which an
#: asynchronous worker's copy may shorten (:class:`LocalMomentum`); matched as :data:`SECOND_MOMENTS` (AdamW is an
#: Adam). Nadam's momentum schedule corrects its start otherwise and is left as compiled.
FIRST_MOMENTS = {"Adam": "beta_1", "AdamW": "beta_1"}


def inner_optimizer(local: Any) -> Any:
    """The optimizer that holds the rate and takes the steps: a ``LossScaleOptimizer``'s inner one, else ``local``."""
    return getattr(local, "inner_optimizer", None) or local


def adapts_step_size(local: Any) -> bool:
    """Whether a Keras optimizer normalises its steps (Adam, RMSprop, Adagrad, ...; not SGD).

    Duck-typed on the class names of ``type(local).__mro__`` (a subclass of
    ``Adam`` counts), looking through a ``LossScaleOptimizer``; an unknown
    optimizer counts as not adaptive.
    """
    return any(cls.__name__ in ADAPTIVE_OPTIMIZERS for cls in type(inner_optimizer(local)).__mro__)


def settable_rate(local: Any) -> bool:
    """Whether a Keras optimizer's learning rate is a number (a variable), not a schedule or a callable."""
    rate = getattr(inner_optimizer(local), "_learning_rate", None)
    return rate is not None and not callable(rate)


def local_setting(local: Any, name: str) -> Any:
    """A Keras optimizer's hyperparameter as a Python value (float32 variables read as 6-digit floats)."""
    value = getattr(local, name, None)
    try:
        return float(f"{float(value):.6g}")
    except (TypeError, ValueError):
        return value


def check_sqrt_scaling(sqrt_scaling, name: str = "sqrt_scaling"):
    if sqrt_scaling is not None and not isinstance(sqrt_scaling, bool):
        raise ConfigError(f"`{name}` must be True, False or None; received {name}={sqrt_scaling!r}")
    return sqrt_scaling


@dataclasses.dataclass(frozen=True)
class LocalMoment:
    """The workers' running magnitude of the gradient averaged over ``K`` times the steps.

    A worker's batch is ``1/K`` of plain training's, so a decay ``d`` (RMSprop's
    ``rho``, Adam's ``beta_2``) averages the squared gradient over ``K`` times fewer
    samples: a noisier magnitude, and steps (the gradient divided by it) no
    longer proportional to the gradient. The workers train with
    ``decay = 1 − (1 − d)/K`` instead, as many samples as plain training's.

    A magnitude averaged over ``K`` times the steps also follows a growing gradient
    ``K`` times more slowly, and RMSprop (``corrects_bias`` False) starts it from zero
    without Adam's correction: its steps, the gradient divided by the magnitude's
    root, could reach ``1/√(1 − decay)`` times the rate (12.6 at 16 workers) at the
    start and wherever the gradient outgrows the magnitude, as it does at a rate
    near the edge of stability. So where a squared gradient exceeds ``1/(1 − d)``
    times the magnitude (a growth; noise seldom goes that far), that coordinate's
    magnitude rises at the compiled decay (:meth:`apply`): no step is then larger
    than the compiled optimizer's largest, ``1/√(1 − d)`` times the rate, from the
    first step (where the magnitude is zero) on. Adam corrects its own start, and its
    longer ``beta_2`` is left to average.

    Attributes:
        name: the Keras optimizer's attribute (``"rho"``, ``"beta_2"``).
        decay: the workers' value of it.
        compiled: the user's value.
        corrects_bias: whether the optimizer corrects the start itself (else the magnitude rises, above).
    """

    name: str
    decay: float
    compiled: float
    corrects_bias: bool

    @classmethod
    def for_workers(cls, local: Any, num_workers: int) -> LocalMoment | None:
        """The workers' moment for ``num_workers`` workers splitting the batch, or None where the optimizer has
        no such decay (:data:`SECOND_MOMENTS`), there is one worker, or the decay is not a number."""
        workers = int(num_workers)
        found = next((SECOND_MOMENTS[c.__name__] for c in type(inner_optimizer(local)).__mro__
                      if c.__name__ in SECOND_MOMENTS), None)
        if found is None or workers < 2:
            return None
        name, corrects = found
        compiled = local_setting(inner_optimizer(local), name)
        if not isinstance(compiled, float) or not 0.0 < compiled < 1.0:
            return None
        return cls(name, 1.0 - (1.0 - compiled) / workers, compiled, corrects)

    def apply(self, local: Any) -> None:
        """Set the workers' decay on a replica's Keras optimizer (before its train step is traced); where the
        optimizer corrects its start and has taken steps (the driver's head, an earlier fit), restate the magnitude
        it holds for the workers' decay (:func:`restate_corrected_magnitude`); where it leaves its start uncorrected,
        let each coordinate's magnitude rise at the compiled decay (:func:`rise_at_compiled_decay`)."""
        optimizer = inner_optimizer(local)
        setattr(optimizer, self.name, self.decay)
        if self.corrects_bias:
            restate_corrected_magnitude(optimizer, self.decay, self.compiled)
        else:
            rise_at_compiled_decay(optimizer, self.decay, self.compiled)

    @property
    def rise_ratio(self) -> float | None:
        """How many times its magnitude a squared gradient must be for the magnitude to rise at the compiled
        decay, ``1/(1 − compiled)``; None where the optimizer corrects its start (the magnitude only averages)."""
        return None if self.corrects_bias else 1.0 / (1.0 - self.compiled)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        rise = ("" if self.corrects_bias else
                f", rising at {self.compiled:.6g} where a squared gradient exceeds {self.rise_ratio:.3g} times it")
        return (f"{self.name} {self.decay:.6g} instead of {self.compiled:.6g}, averaging the gradient's running "
                f"magnitude over as many samples as plain training's{rise}")


def _restate_corrected(variables, steps: int, decay: float, compiled: float) -> None:
    """Rescale running means summed over ``steps`` steps at the ``compiled`` decay so that their correction
    for the start from zero at ``decay`` reads what it read at the compiled one."""
    if steps <= 0 or decay == compiled:
        return
    ratio = (1.0 - decay ** steps) / (1.0 - compiled ** steps)
    for variable in variables:
        variable.assign(variable * ratio)


def restate_corrected_magnitude(optimizer: Any, decay: float, compiled: float) -> None:
    """Rescale the running magnitude ``v`` of a bias-correcting ``optimizer`` (Adam, AdamW, Nadam) that took ``t``
    steps at the ``compiled`` decay, for training on at ``decay``: ``v · (1 − decay^t)/(1 − compiled^t)``.

    Such an optimizer divides ``v`` by ``1 − decay^t`` with the decay it trains at *now*. A replica that starts
    from the driver's head (or from a model trained before) holds a ``v`` summed at the compiled decay over ``t``
    steps; divided by the workers' correction it would read ``(1 − compiled^t)/(1 − decay^t)`` times too large
    (15 times after a head of 128 steps at 16 workers under ``beta_2 = 0.999``), and the workers' steps would be
    about the square root of that too small, their scaled rate undone. Rescaled, the corrected magnitude the
    workers start from is the one the optimizer had. Nothing to do before the first step (``t = 0``).
    """
    steps = int(optimizer.iterations) if optimizer.built else 0
    _restate_corrected([*getattr(optimizer, "_velocities", ()), *(getattr(optimizer, "_velocity_hats", None) or ())],
                       steps, decay, compiled)


def rise_at_compiled_decay(optimizer: Any, decay: float, compiled: float) -> None:
    """Make an RMSprop ``optimizer`` trained at ``decay`` raise a coordinate's magnitude at ``compiled`` where
    the squared gradient ``g²`` exceeds ``1/(1 − compiled)`` times the magnitude ``v`` (:class:`LocalMoment`).

    Keras' own step (every backend's) moves the magnitude to ``decay·v + (1 − decay)·g²``; a hook on the
    optimizer's collective step (``_backend_update_step``, which every backend calls with the final gradients)
    first sets those coordinates to ``(compiled·v + (decay − compiled)·g²)/decay``, from which that step lands
    on ``compiled·v + (1 − compiled)·g²``. Installed once per optimizer; it reads RMSprop's ``_velocities``.
    """
    if getattr(optimizer, "_rises_at_compiled_decay", False):
        return
    from keras import ops

    ratio = 1.0 / (1.0 - compiled)
    keras_step = optimizer._backend_update_step

    def rising_step(grads, variables, learning_rate):
        for gradient, variable in zip(grads, variables, strict=True):
            velocity = optimizer._velocities[optimizer._get_variable_index(variable)]
            v = ops.convert_to_tensor(velocity)
            g2 = ops.square(ops.cast(ops.convert_to_tensor(gradient), v.dtype))
            velocity.assign(ops.where(g2 > ratio * v, (compiled * v + (decay - compiled) * g2) / decay, v))
        return keras_step(grads, variables, learning_rate)

    optimizer._backend_update_step = rising_step
    optimizer._rises_at_compiled_decay = True


def asynchrony_lag(window: int, num_workers: int) -> float:
    """The steps by which an asynchronous worker's view of the center trails a synchronous worker's, where each of
    ``num_workers`` commits every ``window`` local steps and adopts the center of the reply.

    A synchronous worker starts each window from a center that holds every worker's last window. An asynchronous
    one starts from a center that lacks what the others trained since their own last commits: half a window each
    on average, their commits spread over its window, and each of them ``1/K`` of the center's move. So its
    gradients are ``(K − 1)/K · window/2`` steps of the center's progress older, all through its window.
    """
    workers = max(int(num_workers), 1)
    return (workers - 1) / workers * int(window) / 2.0


#: Accuracy's bound on an asynchronous fit's decided windows where its workers train at a scaled rate (applied by
#: :func:`elephant.fit.window.window_cap`, down to its ``ROUND_MIN_WINDOW``): the windows keep each worker's
#: :func:`asynchrony_lag` within this many steps, 24 at 2 workers, 16 at 4, 13 at 8 (the round bound's 32 and 16
#: lagged 12 and 7 steps). A worker that starts its window further behind the center trains its first epoch further
#: behind plain Keras; the bound took most of that back at 2 to 8 workers (docs/convergence.md, "Asynchronous windows
#: bounded by the workers' lag (MAX_ASYNC_LAG)").
MAX_ASYNC_LAG = 6.0


def lag_window(num_workers: int, max_lag: float = MAX_ASYNC_LAG) -> int:
    """The longest window whose :func:`asynchrony_lag` at ``num_workers`` (> 1) is at most ``max_lag`` steps, its
    inverse rounded down: 24 at 2 workers, 16 at 4, 13 at 8."""
    return int(2.0 * max_lag * num_workers / (num_workers - 1))


@dataclasses.dataclass(frozen=True)
class LocalMomentum:
    """An asynchronous worker's shorter running mean of the gradient: Adam's ``beta_1`` less the asynchrony's lag.

    A running mean at decay ``b`` steps along gradients ``b/(1 − b)`` steps old on average (9 at Adam's 0.9). An
    asynchronous worker's gradients are also ``lag`` steps older than a synchronous one's
    (:func:`asynchrony_lag`): staleness acts as momentum of its own (Mitliagkas et al., "Asynchrony begets
    momentum", 2016), and on top of the compiled one it carries the workers' steps further along old gradients
    than plain training's. So the workers' running mean is ``lag`` steps younger, ``a = max(b/(1 − b) − lag, 0)``
    steps, which is the decay ``a/(1 + a)``; the sum of the two ages is the compiled one's where ``a`` > 0.

    Attributes:
        name: the Keras optimizer's attribute (``"beta_1"``).
        decay: the workers' value of it.
        compiled: the user's value.
        lag: the asynchrony's lag in steps it was decided from.
    """

    name: str
    decay: float
    compiled: float
    lag: float

    @classmethod
    def for_lag(cls, local: Any, lag: float) -> LocalMomentum | None:
        """The workers' running mean for gradients ``lag`` steps late, or None where the optimizer has no such
        decay (:data:`FIRST_MOMENTS`), it is not a number in (0, 1), or nothing is late."""
        optimizer = inner_optimizer(local)
        name = next((FIRST_MOMENTS[c.__name__] for c in type(optimizer).__mro__ if c.__name__ in FIRST_MOMENTS), None)
        compiled = local_setting(optimizer, name) if name else None
        if not isinstance(compiled, float) or not 0.0 < compiled < 1.0 or not lag > 0:
            return None
        age = max(compiled / (1.0 - compiled) - float(lag), 0.0)
        return cls(name, float(f"{age / (1.0 + age):.6g}"), compiled, float(lag))

    def apply(self, local: Any) -> None:
        """Set the workers' decay on a replica's Keras optimizer (before its train step is traced); where it has
        taken steps (the driver's head, an earlier fit), restate the running mean it holds for the new decay's
        correction of the start, as :func:`restate_corrected_magnitude` does the magnitude."""
        optimizer = inner_optimizer(local)
        setattr(optimizer, self.name, self.decay)
        steps = int(optimizer.iterations) if optimizer.built else 0
        _restate_corrected(getattr(optimizer, "_momentums", ()), steps, self.decay, self.compiled)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        return (f"{self.name} {self.decay:.6g} instead of {self.compiled:.6g}, its running mean of the gradient "
                f"{self.lag:.3g} steps younger for the asynchronous commits' lag")


#: The most workers at which ``sqrt_scaling=None`` scales the workers' rate from the first step
#: (``√K`` at most 2). Beyond, a rate ten times Keras' default trained at ``√K`` times it from
#: the start collapsed (docs/convergence.md, "The workers' rate under an adaptive optimizer"); the
#: synchronous default ramps the factor up over the first epoch instead (:data:`MAX_RAMPED_WORKERS`),
#: and so does the asynchronous one with windows (with one commit per pass it keeps its outer step).
MAX_SCALED_WORKERS = 4

#: The most workers at which ``sqrt_scaling=None`` scales a rule that ramps (``ramps_scaling``): as far
#: as the ramped factor was tried, where it brought both defaults most of the way back to plain Keras on
#: batches of 1 or 2 per worker (docs/convergence.md, "The small workloads at 8, 16 and 32 workers
#: (simulator, 3 seeds)", its 64 workers); beyond, the workers keep the compiled rate.
MAX_RAMPED_WORKERS = 64


#: The most local steps a ramp of the workers' factor takes: a longer first pass trains its
#: remaining steps at the full factor. A short pass ramps whole; a GRU's long first pass ramped whole
#: ended much further behind plain Keras than ramped over this many steps (docs/convergence.md,
#: "Beyond 4 workers: the factor ramped up over the first epoch").
RAMP_STEPS = 128


def ramped_rates(rate: float, scale: float, steps: int) -> list[float]:
    """The rate of each of a first pass's ``steps``: from ``rate`` at the first step, linearly towards
    ``scale × rate`` over the pass or its first :data:`RAMP_STEPS` steps, whichever is shorter, then at
    it, as the next pass trains (a warm-up of the factor, not of the rate)."""
    steps = max(int(steps), 1)
    ramp = min(steps, RAMP_STEPS)
    return [rate * (1.0 + (scale - 1.0) * min(i / ramp, 1.0)) for i in range(steps)]


def step_rates(rate: float, scale: float, warmup: bool, steps: int) -> list[float] | None:
    """The rate of each of a pass's ``steps`` when it changes within the pass, else None (the pass trains at
    ``scale × rate`` throughout): with ``warmup`` (the fit's first pass) the factor ramps up from 1
    (:func:`ramped_rates`)."""
    return ramped_rates(rate, scale, steps) if warmup and scale != 1.0 else None


class ScaledLocalRate:
    """The square-root learning-rate scaling of the averaging defaults (ModelAveraging, DelayedNesterov).

    With the batch split ``K`` ways, each worker's adaptive optimizer (Adam,
    RMSprop...) divides its steps by a running magnitude of gradients that are
    ``√K`` times noisier than plain training's, so the signal in each step is
    about ``1/√K`` of plain training's, and the mean of the workers' progress,
    which cancels their noise, keeps that shortfall. The workers therefore
    train at ``√K`` times the compiled learning rate: the mean of their steps is
    then about one step of the full batch, signal and noise. SGD's steps average
    to the full batch's exactly and are left alone. Scaling the rate on the
    workers, rather than the mean delta on the server (AGN's ``sqrt_scaling``),
    lets each worker's own optimizer state follow its larger steps; it replaces
    the outer momentum, which the default then turns off. The user's model keeps
    its compiled rate (only the replicas train at the scaled one).

    A factor above 2 (more than :data:`MAX_SCALED_WORKERS` workers) is ramped up:
    in the fit's first epoch each worker's rate grows linearly from the compiled
    one to ``√K`` times it over its pass, at most :data:`RAMP_STEPS` steps
    (:func:`ramped_rates`), as large-batch training warms a scaled rate up; this
    needs a numeric rate (not a schedule).

    ``sqrt_scaling=None`` (the default) is decided by ``for_fit``: on when the
    batch is split among 2 to :data:`MAX_SCALED_WORKERS` workers and the model's
    optimizer adapts its step size, and for a rule whose ``ramps_scaling`` is
    True (or whose ``for_fit`` passes ``ramps=True``: DelayedNesterov with windows)
    also up to :data:`MAX_RAMPED_WORKERS` workers when the compiled rate is
    a number. True scales whenever there are several workers; False never.
    """

    sqrt_scaling: bool | None = None
    decay_scaling: bool | None = None
    ramps_scaling: bool = False  # whether the default scales beyond MAX_SCALED_WORKERS, ramped

    def scaling_for_fit(self, local: Any, num_workers: int, batch_split: bool, ramps: bool | None = None) -> bool:
        """Whether this rule's workers train at a scaled rate in a fit with these settings; ``ramps``
        (None: ``ramps_scaling``) says whether the default scales, ramped, beyond :data:`MAX_SCALED_WORKERS`."""
        if self.sqrt_scaling is not None:
            return self.sqrt_scaling
        workers = int(num_workers)
        if not (batch_split and workers > 1 and adapts_step_size(local)):
            return False
        if workers <= MAX_SCALED_WORKERS:
            return True
        ramps = self.ramps_scaling if ramps is None else ramps
        return ramps and workers <= MAX_RAMPED_WORKERS and settable_rate(local)

    def local_rate_scale(self, local: Any, num_workers: int, batch_split: bool) -> float:
        """``√K`` when the workers train at a scaled rate, else 1."""
        workers = max(int(num_workers), 1)
        return math.sqrt(workers) if self.scaling_for_fit(local, workers, batch_split) and workers > 1 else 1.0

    def local_rate_warmup(self, local: Any, num_workers: int, batch_split: bool) -> bool:
        """Whether the first epoch ramps the workers' factor up (a factor above 2 on a numeric rate)."""
        return (self.local_rate_scale(local, num_workers, batch_split) > math.sqrt(MAX_SCALED_WORKERS)
                and settable_rate(local))

    def local_moment(self, local: Any, num_workers: int, batch_split: bool) -> LocalMoment | None:
        """The workers' longer second-moment decay (:class:`LocalMoment`), or None: their optimizer as compiled.

        ``decay_scaling=None`` (the default) takes it wherever the workers train at a scaled rate on the split
        batch, for an optimizer with such a decay (:data:`SECOND_MOMENTS`), under a schedule too; True wherever
        there are several workers and the decay exists; False never.
        """
        if self.decay_scaling is False:
            return None
        moment = LocalMoment.for_workers(local, num_workers)
        if moment is None or self.decay_scaling:
            return moment
        return moment if self.scaling_for_fit(local, num_workers, batch_split) else None

    def resolved_for_fit(self, local: Any, num_workers: int, batch_split: bool, unscaled_momentum: float | None,
                         ramps: bool | None = None):
        """This rule with ``sqrt_scaling`` decided and, when the user gave none, the outer momentum: 0 when
        the workers' rate is scaled (no gain on top of it), else ``unscaled_momentum``; ``self`` if nothing changes."""
        scaled = self.scaling_for_fit(local, num_workers, batch_split, ramps)
        momentum = self.outer.momentum
        if momentum is None and int(num_workers) >= 2:
            momentum = 0.0 if scaled else unscaled_momentum
        if momentum == self.outer.momentum and scaled == bool(self.sqrt_scaling):
            return self
        return type(self).from_config({**self.get_config(), "sqrt_scaling": scaled, "outer_momentum": momentum})

    def describe_scaling(self, num_workers: int) -> str:
        """The fit-start log's words for the scaling ("" when off)."""
        workers = max(int(num_workers), 1)
        if not self.sqrt_scaling or workers < 2:
            return ""
        ramp = (f", from the first epoch's steps after those the driver trains (elephant.fit.head), else ramped "
                f"up from the compiled rate over the first epoch (its first {RAMP_STEPS} steps at most) when that "
                "is a number" if workers > MAX_SCALED_WORKERS else "")
        return (f"; the workers train at sqrt({workers}) = {math.sqrt(workers):.3g} times the compiled learning rate "
                f"for the adaptive optimizer's steps on the split batch{ramp} (sqrt_scaling=False turns it off)")

