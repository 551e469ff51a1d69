"""The recipe: what the defaults add to the user's optimizer, one step after another.

The user's compiled optimizer trains every replica. On top of it, a fit with the
synchronous or asynchronous default goes through :data:`RECIPE`, in order, and
each step adjusts the plan or says why it does not: its condition is its
function, its switch the user-facing way to turn it off, its reason one line
(the measurements are in docs/convergence.md, "What the defaults add to your
optimizer"). :func:`~elephant.fit.plan.plan_fit` builds every
:class:`~elephant.fit.plan.FitPlan` through it (:func:`follow`), so this module
is the one place that says what a default fit does; ``sm.fit_plan["recipe"]``
and the fit-start log say what each step did in a fit. A named rule (DOWNPOUR,
AGN...) goes through the same steps, and most of them say it does not take them.

Each step is a function ``(fit, plan) -> Decision`` over the fit's inputs
(:class:`Fit`) and the plan's values the steps before it decided (a dict of
:class:`~elephant.fit.plan.FitPlan` fields); the values it returns are merged in.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from elephant.config import Settings
from elephant.fit import window as W
from elephant.fit.head import head_steps
from elephant.optimizers.base import worker_batch_size
from elephant.optimizers.local import (MAX_RAMPED_WORKERS, MAX_SCALED_WORKERS, LocalMoment,
                                       adapts_step_size, inner_optimizer, settable_rate)

__all__ = ["RECIPE", "Decision", "Fit", "Outcome", "Step", "describe_outcomes", "follow"]

ONE_WORKER = "1 worker"


@dataclasses.dataclass(frozen=True)
class Fit:
    """What a fit's recipe is decided from: ``plan_fit``'s arguments and the model's size.

    Attributes:
        settings: the ``SparkModel``'s settings (its rule is ``settings.optimizer``).
        local: the model's compiled Keras optimizer.
        num_workers, batch_size: the workers ``K`` and ``fit``'s ``batch_size``.
        samples: the training samples (None: unknown).
        cores: the cores of a task.
        hosted: whether the tasks serve the parameter server (``ps_placement="executors"``, Spark Connect).
        params, model_bytes: the model's parameters and the bytes of its weights.
    """

    settings: Settings
    local: Any
    num_workers: int
    batch_size: int
    samples: int | None
    cores: int
    hosted: bool
    params: int
    model_bytes: int

    def pass_steps(self, per_worker: int) -> int | None:
        """The local steps of a worker's pass over its partition at ``per_worker`` samples a step (None: unknown)."""
        if not self.samples:
            return None
        return max(1, math.ceil(math.ceil(self.samples / self.num_workers) / per_worker))

    def step_ms(self, per_worker: int) -> float:
        return W.estimate_step_ms(self.params, per_worker, self.cores)

    @property
    def commit_ms(self) -> float:
        return W.estimate_commit_ms(self.model_bytes)

    @property
    def optimizer_name(self) -> str:
        """The class of the user's optimizer (the inner one of a loss-scale optimizer): "Adam", "SGD"..."""
        return type(inner_optimizer(self.local)).__name__


@dataclasses.dataclass(frozen=True)
class Decision:
    """What a step decided: the plan's ``values`` it sets, and why it was skipped (None: applied)."""

    values: dict[str, Any]
    skipped: str | None = None


@dataclasses.dataclass(frozen=True)
class Step:
    """One adjustment of the recipe.

    Attributes:
        name: the step's name (``sm.fit_plan["recipe"]``, README.md's table).
        decide: its condition, as code: the plan's values it sets, and why it was skipped.
        when: its condition, in words.
        switch: the user-facing setting that turns it off (a ``"config"`` key goes in
            ``optimizer={"name": ..., "config": {...}}``).
        reason: why the step is there, in one line (the figures are in docs/convergence.md).
    """

    name: str
    decide: Callable[[Fit, dict[str, Any]], Decision]
    when: str
    switch: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one step did in one fit (``sm.fit_plan["recipe"]``): ``why`` is its reason, or why it was skipped."""

    step: str
    applied: bool
    why: str

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _rule_name(rule: Any) -> str:
    return type(rule).__name__


def _off(setting: str) -> str:
    return f"switched off: {setting}"


# ------------------------------------------------------------------------------------------------ the steps
def batch_split(fit: Fit, plan: dict[str, Any]) -> Decision:
    """Each worker trains ``ceil(batch_size / K)`` samples a step: the rule splits the batch, unless told not to."""
    split = fit.settings.splits_batch
    values = {"splits_batch": split, "worker_batch_size": worker_batch_size(fit.batch_size, fit.num_workers, split)}
    if not split:
        return Decision(values, _off("batch_split=False") if fit.settings.batch_split is False else
                        f"the rule ({_rule_name(fit.settings.optimizer)}) gives each worker the full batch")
    return Decision(values, ONE_WORKER if fit.num_workers < 2 else None)


def window_from_costs(fit: Fit, plan: dict[str, Any]) -> Decision:
    """The window, decided from a step's and a commit's costs within accuracy's bounds, where nothing fixes it."""
    settings, rule = fit.settings, fit.settings.optimizer
    window, split, per_worker = settings.window, plan["splits_batch"], plan["worker_batch_size"]
    fixed = {"window": window, "window_choice": None}
    if settings.frequency is not None:
        return Decision(fixed, _off(f"frequency={settings.frequency!r}"))
    if not rule.adapts_window:
        return Decision(fixed, f"the rule ({_rule_name(rule)}) has its own window: {window}")
    if not fit.samples:
        return Decision(fixed, "the number of samples is unknown: the rule's own window")
    choice = W.WindowChoice.decide(
        floor=rule.window_from_costs, per_pass=window is None, model_bytes=fit.model_bytes,
        step_ms=fit.step_ms(per_worker), commit_ms=fit.commit_ms, steps_per_pass=fit.pass_steps(per_worker),
        budget=settings.comm_budget, measured=False, workers=fit.num_workers if split else 1,
        least=W.round_least(rule, fit.local, fit.num_workers, split))
    return Decision({"window": choice.window, "window_choice": choice})


def lag_bound(fit: Fit, plan: dict[str, Any]) -> Decision:
    """Asynchronous windows, decided again so that each worker starts within ``MAX_ASYNC_LAG`` steps of the center.

    The choice records that its commits lag (``lagged``) in every asynchronous fit; the bound goes below the rule's
    floor (and so changes a window) only where the round bound may (``least``: the workers' rate scaled)."""
    choice = plan["window_choice"]
    if choice is None:
        return Decision({}, "no window decided from the fit's costs")
    if fit.settings.mode == "synchronous":
        return Decision({}, "synchronous rounds: every worker starts its window from the same center")
    fields = {**choice.as_dict(), "lagged": True}
    del fields["window"]
    lagged = W.WindowChoice.decide(**fields)
    values = {"window": lagged.window, "window_choice": lagged}
    if lagged.window is None:
        return Decision(values, "one commit per pass: every worker starts its pass from the same center")
    if lagged.workers < 2:
        return Decision(values, ONE_WORKER if fit.num_workers < 2 else _off("batch_split=False"))
    if lagged.least >= lagged.floor:
        return Decision(values, f"the workers train at the compiled rate: the windows keep the rule's floor of "
                                f"{lagged.floor} steps")
    return Decision(values)


def outer_nesterov(fit: Fit, plan: dict[str, Any]) -> Decision:
    """The rule made for the fit (``for_fit``), with an outer Nesterov step where the workers' rate is not scaled."""
    rule = fit.settings.optimizer.for_fit(fit.local, fit.num_workers, plan["splits_batch"], plan["window"])
    values = {"rule": rule}
    resolved, given = getattr(rule, "inner", rule), getattr(fit.settings.optimizer, "inner", fit.settings.optimizer)
    outer = getattr(resolved, "outer", None)
    if outer is None:
        return Decision(values, f"the rule ({_rule_name(resolved)}) takes no outer step")
    if fit.num_workers < 2:
        return Decision(values, ONE_WORKER)
    if outer.learning_rate != 1.0 or outer.resolve_momentum(fit.num_workers) != 0.0:
        return Decision(values)
    if given.outer.momentum is not None:
        return Decision(values, _off(f"outer_momentum={given.outer.momentum:g}"))
    if getattr(resolved, "sqrt_scaling", False):
        return Decision(values, "the workers' rate is scaled instead")
    return Decision(values, "the asynchronous default commits in windows, where block momentum overshoots")


def sqrt_scaling(fit: Fit, plan: dict[str, Any]) -> Decision:
    """The workers' factor on the compiled learning rate: ``√K`` for an adaptive optimizer on the split batch."""
    scale = plan["rule"].local_rate_scale(fit.local, fit.num_workers, plan["splits_batch"])
    return Decision({"learning_rate_scale": scale}, None if scale > 1.0 else _unscaled(fit, plan))


def _unscaled(fit: Fit, plan: dict[str, Any]) -> str:
    """Why the workers train at the compiled rate."""
    rule = getattr(plan["rule"], "inner", plan["rule"])
    given = getattr(fit.settings.optimizer, "inner", fit.settings.optimizer)
    if not hasattr(rule, "scaling_for_fit"):
        return f"the rule ({_rule_name(rule)}) keeps the compiled rate"
    if given.sqrt_scaling is False:
        return _off("sqrt_scaling=False")
    if fit.num_workers < 2:
        return ONE_WORKER
    if not plan["splits_batch"]:
        return _off("batch_split=False")
    if not adapts_step_size(fit.local):
        return f"the user's optimizer is {fit.optimizer_name}"
    if fit.num_workers > MAX_RAMPED_WORKERS:
        return f"more than {MAX_RAMPED_WORKERS} workers"
    if not settable_rate(fit.local):
        return f"more than {MAX_SCALED_WORKERS} workers and a learning-rate schedule"
    return f"more than {MAX_SCALED_WORKERS} workers and one commit per pass"


def head(fit: Fit, plan: dict[str, Any]) -> Decision:
    """The first epoch's first steps, trained on the driver on the global batch, where the workers' rate is scaled."""
    if plan["learning_rate_scale"] <= 1.0:
        return Decision({"head_steps": 0}, "the workers' rate is not scaled")
    if fit.hosted:
        return Decision({"head_steps": 0}, "the parameter server runs in the tasks, not on the driver")
    if fit.num_workers > fit.batch_size:
        return Decision({"head_steps": 0}, f"more workers ({fit.num_workers}) than the batch has samples "
                                           f"({fit.batch_size})")
    steps = head_steps(fit.pass_steps(plan["worker_batch_size"]))
    return Decision({"head_steps": steps}, None if steps else "a worker's pass has one step, or an unknown number")


def _ramps(fit: Fit, plan: dict[str, Any]) -> bool:
    """Whether the workers' factor is one the first epoch ramps up (above 2, on a numeric rate)."""
    return plan["rule"].local_rate_warmup(fit.local, fit.num_workers, plan["splits_batch"])


def _no_ramp(plan: dict[str, Any]) -> str:
    if plan["learning_rate_scale"] <= 1.0:
        return "the workers' rate is not scaled"
    if plan["learning_rate_scale"] <= math.sqrt(MAX_SCALED_WORKERS):
        return f"{MAX_SCALED_WORKERS} workers or fewer: the factor holds from the first step"
    return "a learning-rate schedule"


def ramp(fit: Fit, plan: dict[str, Any]) -> Decision:
    """The workers' factor ramped up from 1 over the first epoch's first steps, beyond 4 workers without a head."""
    ramps = _ramps(fit, plan)
    if not ramps:
        return Decision({"learning_rate_warmup": False}, _no_ramp(plan))
    if plan["head_steps"]:
        return Decision({"learning_rate_warmup": False}, "the driver's head starts the workers instead")
    return Decision({"learning_rate_warmup": True})


def warmup_window(fit: Fit, plan: dict[str, Any]) -> Decision:
    """Shorter windows over the workers' first steps, beyond 4 workers at a scaled rate, where costs decide them."""
    if plan["window_choice"] is None:
        return Decision({"warmup_window": None}, "no window decided from the fit's costs")
    if not _ramps(fit, plan):
        return Decision({"warmup_window": None}, _no_ramp(plan))
    if not plan["splits_batch"]:
        return Decision({"warmup_window": None}, _off("batch_split=False"))
    bounded = W.warmup_window(plan["window"], fit.num_workers)
    if bounded is None:
        return Decision({"warmup_window": None}, "one commit per pass" if plan["window"] is None else
                        f"the window is within {W.WARMUP_ROUND_STEPS} steps a round already")
    return Decision({"warmup_window": bounded})


def local_moment(fit: Fit, plan: dict[str, Any]) -> Decision:
    """The workers' running magnitude of the gradient averaged over ``K`` times the steps, where the rate is scaled."""
    moment = plan["rule"].local_moment(fit.local, fit.num_workers, plan["splits_batch"])
    if moment is not None:
        return Decision({"local_moment": moment})
    rule = getattr(plan["rule"], "inner", plan["rule"])
    if not hasattr(rule, "decay_scaling"):
        why = f"the rule ({_rule_name(rule)}) leaves it as compiled"
    elif rule.decay_scaling is False:
        why = _off("decay_scaling=False")
    elif fit.num_workers < 2:
        why = ONE_WORKER
    elif LocalMoment.for_workers(fit.local, fit.num_workers) is None:
        why = f"the user's optimizer ({fit.optimizer_name}) has no second-moment decay to spread"
    else:
        why = "the workers' rate is not scaled"
    return Decision({"local_moment": None}, why)


def local_momentum(fit: Fit, plan: dict[str, Any]) -> Decision:
    """Adam's running mean of the gradient younger by the lag of asynchronous windows, beyond 4 workers, scaled."""
    window = plan["window"]
    momentum = plan["rule"].local_momentum(fit.local, fit.num_workers, plan["splits_batch"], window)
    if momentum is not None:
        return Decision({"local_momentum": momentum})
    rule = getattr(plan["rule"], "inner", plan["rule"])
    if not hasattr(rule, "momentum_scaling"):
        why = f"the rule ({_rule_name(rule)}) leaves it as compiled"
    elif rule.momentum_scaling is False:
        why = _off("momentum_scaling=False")
    elif fit.num_workers < 2:
        why = ONE_WORKER
    elif window is None:
        why = "one commit per pass: nothing lags"
    elif rule.momentum_scaling is None and fit.num_workers <= MAX_SCALED_WORKERS:
        why = f"{MAX_SCALED_WORKERS} workers or fewer"
    elif rule.momentum_scaling is None and plan["learning_rate_scale"] <= 1.0:
        why = "the workers' rate is not scaled"
    else:
        why = f"the user's optimizer ({fit.optimizer_name}) has no running mean of the gradient to shorten"
    return Decision({"local_momentum": None}, why)


#: The recipe, in the order the steps adjust the plan (README.md's table "Accuracy: what the defaults add to your
#: optimizer" lists the same steps in the same order).
RECIPE: tuple[Step, ...] = (
    Step("batch_split", batch_split,
         when="the rule splits the batch (both defaults), 2 workers or more",
         switch="SparkModel(batch_split=False)",
         reason="batch_size is the global batch, so the workers take as many steps per epoch as model.fit"),
    Step("window_from_costs", window_from_costs,
         when="both defaults, without a frequency, the samples known",
         switch="SparkModel(frequency=k)",
         reason="commits take at most comm_budget of a worker's time, within the windows accuracy allows"),
    Step("lag_bound", lag_bound,
         when="the asynchronous default's decided windows, the workers' rate scaled",
         switch="SparkModel(frequency=k)",
         reason="a worker that starts its window far behind the center trains behind plain Keras"),
    Step("outer_nesterov", outer_nesterov,
         when="the workers' rate not scaled; asynchronous: one commit per pass",
         switch='"outer_momentum": 0',
         reason="plain averaging moves the center by one worker's progress a round; block momentum makes it more"),
    Step("sqrt_scaling", sqrt_scaling,
         when="an adaptive optimizer on the split batch: 2 to 4 workers; 5 to 64 with a numeric rate (asynchronous: "
              "in windows)",
         switch='"sqrt_scaling": False',
         reason="an adaptive optimizer's steps on 1/K of the batch carry 1/√K of its signal; √K times the rate gives "
                "it back"),
    Step("head", head,
         when="the rate scaled, the server on the driver, a sample or more a worker",
         switch='"sqrt_scaling": False',
         reason="averaging adaptive steps loses most in the first steps, so the driver trains them on the global "
                "batch"),
    Step("ramp", ramp,
         when="the rate scaled beyond 4 workers, without a head",
         switch='"sqrt_scaling": False',
         reason="a large factor from the first step collapses at high rates; ramped up from 1 it trains"),
    Step("warmup_window", warmup_window,
         when="the rate scaled beyond 4 workers, the window decided from the fit's costs",
         switch="SparkModel(frequency=k)",
         reason="the workers drift apart most in the first steps, so they average more often there"),
    Step("local_moment", local_moment,
         when="the rate scaled, an optimizer with a second-moment decay (Adam, RMSprop...)",
         switch='"decay_scaling": False',
         reason="over K times the steps, a worker's running magnitude of the gradient averages as many samples as "
                "plain training's"),
    Step("local_momentum", local_momentum,
         when="the asynchronous default's windows beyond 4 workers, the rate scaled, Adam",
         switch='"momentum_scaling": False',
         reason="staleness acts as momentum, so the workers' own running mean is younger by what their commits lag"),
)


def follow(fit: Fit, recipe: Sequence[Step] = RECIPE) -> tuple[dict[str, Any], tuple[Outcome, ...]]:
    """The plan's values after each step of ``recipe`` in turn, and what each step did."""
    plan: dict[str, Any] = {}
    outcomes = []
    for step in recipe:
        decision = step.decide(fit, plan)
        plan.update(decision.values)
        applied = decision.skipped is None
        outcomes.append(Outcome(step.name, applied, step.reason if applied else decision.skipped))
    return plan, tuple(outcomes)


def describe_outcomes(outcomes: Sequence[Outcome]) -> str:
    """The fit-start log's words for the recipe: the steps applied, then those skipped, each with why."""
    applied = ", ".join(o.step for o in outcomes if o.applied) or "none"
    skipped = "; ".join(f"{o.step} ({o.why})" for o in outcomes if not o.applied) or "none"
    return f"the defaults' recipe (elephant.fit.recipe) applied: {applied}; skipped: {skipped}"
