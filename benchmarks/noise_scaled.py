"""How the workers' adaptive optimizer reads a split batch: two diagnostics of the local steps.

The averaging defaults train each worker at ``√K`` times the compiled rate under an
adaptive optimizer (``sqrt_scaling``): a worker's batch is ``K`` times smaller, and where a
coordinate's gradient is dominated by noise its running magnitude (RMSprop's and Adam's
second moment) grows ``K``-fold, so its steps carry ``1/√K`` of plain training's signal.
This script changes the workers' optimizer in one of two ways (the user's model and plain
Keras keep theirs):

* a per-coordinate factor instead of ``√K`` (the default): where the signal dominates, the
  magnitude does not grow and ``√K`` overshoots. Each worker's optimizer keeps slow running
  means of the gradient ``m`` and of its square ``q`` (decay ``--beta``, bias-corrected),
  reads from them its noise variance ``w`` (what ``q − m²`` holds, less what of it the
  running mean keeps) and its squared signal ``s²``, and scales every step of each
  coordinate by ``f = sqrt(clip((s² + w) / (s² + w / K), 1, K))``, the ratio of the
  worker's gradient magnitude to plain training's (``K`` times the batch: ``w / K``). The
  distributed rule then runs without its own scaling (``sqrt_scaling=False``, no outer
  momentum);
* ``--longer-decay`` (with ``--no-factor``: the mode's default rule and its ``√K``): the
  workers' second moment averages ``K`` times as many steps (RMSprop's ``rho``, Adam's
  ``beta_2``: ``1 − (1 − d)/K``), so that it is taken over as many samples as plain
  training's; over RMSprop's 10 steps of 8 samples it is a noisy estimate, and the step,
  the gradient divided by it, is no longer proportional to the gradient. RMSprop's running
  magnitude starts at 0 uncorrected, so its first steps are up to ``1/√(1 − rho)`` times the
  rate; ``--debias`` divides it by ``1 − rho^t`` as Adam does.

Every fit runs at a fixed window (``--frequency``; 16 is the defaults' at 8 workers), with the
rule's own ``decay_scaling`` off: the longer decay measured here is now what the defaults do
(``elephant.optimizers.local.LocalMoment``, whose RMSprop magnitude rises at the compiled
``rho`` where the gradient grows, which also covers the start), and this script keeps measuring
against the former defaults.

Run::

    python benchmarks/noise_scaled.py --workload textures-conv2d-1pass --workers 8 --mode synchronous --seeds 0 1 2
    python benchmarks/noise_scaled.py --workload textures-conv2d-1pass --workers 8 --no-factor --longer-decay \
        --mode asynchronous --seeds 0 1 2

Each fit appends one row to ``results/noise_scaled.json``; compare it with the
defaults' rows of ``results/convergence_sim_onepass.json`` and plain Keras' mean over
shuffle orders in ``results/convergence_sim_orders.json`` (docs/convergence.md, "Reading a
gap: plain Keras' own spread").
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

WHAT = ("The workers' adaptive optimizer changed in the simulator (benchmarks/noise_scaled.py): factor, its "
        "steps scaled per coordinate by a noise-aware factor in [1, sqrt(K)] (no sqrt_scaling, no outer momentum); "
        "longer_decay, its second moment's decay spread over K times the steps (rho, beta_2); debias, RMSprop's "
        "running magnitude bias-corrected.")


def noise_factor(ops, mean, square, steps, beta: float, workers: int):
    """The per-coordinate factor ``f`` in ``[1, √K]`` from running means of the gradient and of its square.

    ``mean`` and ``square`` are exponential moving averages (decay ``beta``, started at 0)
    after ``steps`` updates. Of a noise of variance ``w`` the running mean keeps
    ``c·w``, ``c = (1 − β)/(1 + β)``, so ``q − m² ≈ (1 − c)·w`` and ``m² ≈ s² + c·w``.
    A coordinate whose gradient is always 0 gets 1.
    """
    corr = 1.0 - beta ** steps
    m, q = mean / corr, square / corr
    c = (1.0 - beta) / (1.0 + beta)
    noise = ops.maximum(q - ops.square(m), 0.0) / (1.0 - c)
    signal = ops.maximum(ops.square(m) - c * noise, 0.0)
    tiny = 1e-30
    return ops.sqrt(ops.clip((signal + noise + tiny) / (signal + noise / workers + tiny), 1.0, float(workers)))


def noise_scaled(base):
    """A subclass of the Keras optimizer class ``base`` whose every step is scaled by :func:`noise_factor`."""
    import keras
    from keras import ops

    class NoiseScaled(base):
        def __init__(self, *args, workers=1, beta=0.99, **kwargs):
            super().__init__(*args, **kwargs)
            self.workers, self.beta = int(workers), float(beta)

        def get_config(self):
            return {**super().get_config(), "workers": self.workers, "beta": self.beta}

        def build(self, var_list):
            if self.built:
                return
            super().build(var_list)
            self._grad_means = [self.add_variable_from_reference(v, "grad_mean") for v in var_list]
            self._grad_squares = [self.add_variable_from_reference(v, "grad_square") for v in var_list]

        def update_step(self, gradient, variable, learning_rate):
            i = self._get_variable_index(variable)
            g = ops.cast(gradient, variable.dtype)
            mean, square = self._grad_means[i], self._grad_squares[i]
            self.assign(mean, self.beta * mean + (1.0 - self.beta) * g)
            self.assign(square, self.beta * square + (1.0 - self.beta) * ops.square(g))
            steps = ops.cast(self.iterations + 1, variable.dtype)
            factor = noise_factor(ops, mean, square, steps, self.beta, self.workers)
            before = ops.convert_to_tensor(variable) + 0.0
            super().update_step(gradient, variable, learning_rate)
            self.assign(variable, before + factor * (ops.convert_to_tensor(variable) - before))

    NoiseScaled.__name__ = NoiseScaled.__qualname__ = f"NoiseScaled{base.__name__}"
    return keras.saving.register_keras_serializable(package="elephant_benchmarks")(NoiseScaled)


@functools.lru_cache(maxsize=None)
def debiased_rmsprop():
    """RMSprop whose running magnitude is bias-corrected (divided by ``1 − rho^t``, as Adam's), so that its
    first steps are the rate's size rather than up to ``1/√(1 − rho)`` times it (no momentum, not centered)."""
    import keras
    from keras import ops

    class DebiasedRMSprop(keras.optimizers.RMSprop):
        def update_step(self, gradient, variable, learning_rate):
            velocity = self._velocities[self._get_variable_index(variable)]
            g = ops.cast(gradient, variable.dtype)
            self.assign(velocity, self.rho * velocity + (1.0 - self.rho) * ops.square(g))
            steps = ops.cast(self.iterations + 1, variable.dtype)
            magnitude = velocity / (1.0 - ops.power(ops.cast(self.rho, variable.dtype), steps))
            rate = ops.cast(learning_rate, variable.dtype)
            self.assign_sub(variable, rate * g / ops.sqrt(magnitude + self.epsilon))

    return keras.saving.register_keras_serializable(package="elephant_benchmarks")(DebiasedRMSprop)


def longer_decay(config: dict, workers: int) -> dict:
    """A Keras optimizer's config whose second moment averages ``K`` times as many steps (RMSprop's ``rho``,
    Adam's ``beta_2``: ``1 − (1 − d)/K``), as many samples as plain training's at ``K`` times the batch."""
    key = "rho" if "rho" in config else "beta_2"
    return {**config, key: 1.0 - (1.0 - float(config[key])) / workers}


def rebuild(wl, workers: int, beta: float, factor: bool = True, decay: bool = False, debias: bool = False) -> None:
    """Make ``wl.build`` compile its model with its own optimizer at its own rate, noise-scaled (``factor``),
    with its second moment's decay spread over ``K`` times the steps (``decay``), or as RMSprop with a
    bias-corrected running magnitude (``debias``, without ``factor``)."""
    build = wl.build
    classes = {}

    def scaled(seed):
        model = build(seed)
        local = model.optimizer
        config = {k: v for k, v in local.get_config().items() if k != "name"}
        if decay:
            config = longer_decay(config, workers)
        if factor:
            base = type(local)
            if base not in classes:
                classes[base] = noise_scaled(base)
            local = classes[base].from_config({**config, "workers": workers, "beta": beta})
        elif debias:
            if type(local).__name__ != "RMSprop" or config.get("momentum") or config.get("centered"):
                raise ValueError(f"--debias needs a workload compiled with plain RMSprop (no momentum, not "
                                 f"centered); {wl.name} has {type(local).__name__}({config})")
            local = debiased_rmsprop().from_config(config)
        else:
            local = type(local).from_config(config)
        model.compile(local, model.loss, metrics=None if wl.metric == "loss" else [wl.metric])
        return model

    wl.build = scaled


def main() -> None:
    import workloads as WL
    from elephant.optimizers import simulate_fit

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", required=True, choices=WL.NAMES)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--mode", choices=["synchronous", "asynchronous"], default="synchronous")
    parser.add_argument("--frequency", type=int, default=16, help="local steps per commit (the defaults' at 8)")
    parser.add_argument("--beta", type=float, default=0.99, help="decay of the gradient's running means")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--no-factor", action="store_true",
                        help="no per-coordinate factor: the mode's default rule with its own scaling (sqrt(K))")
    parser.add_argument("--debias", action="store_true",
                        help="with --no-factor, on an RMSprop workload: its running magnitude bias-corrected")
    parser.add_argument("--longer-decay", action="store_true",
                        help="the workers' second moment averages K times as many steps (rho, beta_2)")
    args = parser.parse_args()
    if args.debias and not args.no_factor:
        parser.error("--debias replaces the workers' RMSprop, which the factor's subclass does too: add --no-factor")
    rule = "modelaveraging" if args.mode == "synchronous" else "delayednesterov"
    # the library's own longer decay (decay_scaling, now a default) is off: each variant replaces or adds to the
    # former default, as its rows were measured
    config = {"decay_scaling": False} if args.no_factor else {"sqrt_scaling": False, "outer_momentum": 0.0,
                                                              "decay_scaling": False}
    optimizer = {"name": rule, "config": config}
    path = os.path.join(HERE, "results", "noise_scaled.json")
    rows = json.load(open(path))["rows"] if os.path.exists(path) else []
    for seed in args.seeds:
        wl = WL.make(args.workload)
        rebuild(wl, args.workers, args.beta, factor=not args.no_factor, decay=args.longer_decay,
                debias=args.debias)
        t0 = time.perf_counter()
        fit = simulate_fit(wl.build(seed), wl.x, wl.y, epochs=wl.epochs, batch_size=wl.batch_size,
                           num_workers=args.workers, seed=seed, mode=args.mode, frequency=args.frequency,
                           optimizer=optimizer, validation_data=(wl.x_test, wl.y_test))
        curve = [float(v) for v in fit.history["val_" + wl.metric]]
        row = {"workload": args.workload, "workers": args.workers, "seed": seed, "mode": args.mode,
               "frequency": args.frequency, "beta": args.beta, "factor": not args.no_factor,
               "longer_decay": args.longer_decay, "debias": args.debias, "optimizer": repr(fit.optimizer),
               "curve": curve, "final": curve[-1],
               "seconds": time.perf_counter() - t0}
        print(json.dumps(row), flush=True)
        rows.append(row)
        with open(path, "w") as f:
            json.dump({"meta": {"what": WHAT}, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
