"""The averaging defaults' square-root scaling of the workers' learning rate (ScaledLocalRate)."""

import dataclasses
import math
import os

import numpy as np
import pytest

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
import keras  # noqa: E402

from elephant import backends  # noqa: E402
from elephant import optimizers as O  # noqa: E402
from elephant import worker  # noqa: E402
from elephant.config import Settings  # noqa: E402
from elephant.errors import ConfigError  # noqa: E402
from elephant.fit import head  # noqa: E402
from elephant.fit.loop import settable_learning_rate  # noqa: E402
from elephant.fit.plan import plan_fit  # noqa: E402
from elephant.model_io import fingerprint, model_to_bytes  # noqa: E402
from elephant.optimizers.local import lag_window, ramped_rates  # noqa: E402
from elephant.ps.store import Store  # noqa: E402

ADAM, RMSPROP, SGD = keras.optimizers.Adam, keras.optimizers.RMSprop, keras.optimizers.SGD


@pytest.mark.parametrize("name", ["modelaveraging", "delayednesterov"])
@pytest.mark.parametrize("local, workers, split, given, scale, momentum", [
    (ADAM, 4, True, {}, 2.0, 0.0),                          # the default: sqrt(K), and no outer momentum on top
    (RMSPROP, 3, True, {}, 3 ** 0.5, 0.0),
    (RMSPROP, 9, True, {"sqrt_scaling": True}, 3.0, 0.0),   # unless asked for
    (ADAM, 1, True, {}, 1.0, None),                         # one worker is plain training
    (ADAM, 4, False, {}, 1.0, None),                        # full batches per worker: steps as plain training's
    (SGD, 4, True, {}, 1.0, None),                          # SGD's steps average to the full batch's
    (ADAM, 4, True, {"sqrt_scaling": False}, 1.0, None),    # off
    (SGD, 4, True, {"sqrt_scaling": True}, 2.0, 0.0),       # on whatever the optimizer
    (ADAM, 4, True, {"outer_momentum": 0.5}, 2.0, 0.5),     # a given momentum is kept
])
def test_the_workers_rate_factor_and_the_outer_momentum(name, local, workers, split, given, scale, momentum):
    rule = O.get(name, **given)
    fitted = rule.for_fit(local(), workers, split, None)  # one commit per pass (windows: below)
    assert fitted.local_rate_scale(local(), workers, split) == pytest.approx(scale)
    assert fitted.outer.momentum == momentum
    assert rule.sqrt_scaling == given.get("sqrt_scaling")  # the user's rule is not changed


DECAY = keras.optimizers.schedules.ExponentialDecay(1e-3, 10, 0.5)


@pytest.mark.parametrize("name, local, workers, window, given, scale, warmup, momentum", [
    ("modelaveraging", ADAM(1e-3), 8, 16, {}, 8 ** 0.5, True, 0.0),     # synchronous: ramped beyond 4 workers
    ("modelaveraging", RMSPROP(1e-3), 32, 8, {}, 32 ** 0.5, True, 0.0),
    ("modelaveraging", ADAM(1e-3), 64, 8, {}, 8.0, True, 0.0),
    ("modelaveraging", ADAM(1e-3), 65, 8, {}, 1.0, False, None),        # beyond what was measured: the outer step
    ("modelaveraging", ADAM(DECAY), 8, 16, {}, 1.0, False, None),
    ("modelaveraging", ADAM(1e-3), 4, 32, {}, 2.0, False, 0.0),         # up to 4: the factor from the first step
    ("modelaveraging", SGD(1e-2), 8, 16, {}, 1.0, False, None),
    ("delayednesterov", ADAM(1e-3), 8, 16, {}, 8 ** 0.5, True, 0.0),    # asynchronous windows: ramped too
    ("delayednesterov", RMSPROP(1e-3), 32, 16, {}, 32 ** 0.5, True, 0.0),
    ("delayednesterov", ADAM(1e-3), 64, 8, {}, 8.0, True, 0.0),
    ("delayednesterov", ADAM(1e-3), 65, 16, {}, 1.0, False, 0.0),       # beyond: windows' momentum (none)
    ("delayednesterov", ADAM(DECAY), 8, 16, {}, 1.0, False, 0.0),
    ("delayednesterov", ADAM(1e-3), 5, None, {}, 1.0, False, None),     # one commit per pass: the outer step
    ("delayednesterov", ADAM(1e-3), 9, None, {"sqrt_scaling": True}, 3.0, True, 0.0),  # unless asked for
    ("modelaveraging", ADAM(DECAY), 9, 8, {"sqrt_scaling": True}, 3.0, False, 0.0),  # a schedule: scaled whole
])
def test_beyond_four_workers_the_windowed_defaults_ramp_their_factor(name, local, workers, window, given, scale,
                                                                      warmup, momentum):
    fitted = O.get(name, **given).for_fit(local, workers, True, window)
    assert fitted.local_rate_scale(local, workers, True) == pytest.approx(scale)
    assert fitted.local_rate_warmup(local, workers, True) is warmup
    assert fitted.outer.momentum == momentum  # None: the unscaled default, decided by the outer step


def test_a_ramp_starts_at_the_compiled_rate_and_climbs_to_the_factor():
    assert ramped_rates(0.01, 3.0, 4) == pytest.approx([0.01, 0.015, 0.02, 0.025])
    assert ramped_rates(0.01, 3.0, 0) == pytest.approx([0.01])
    long = ramped_rates(0.01, 3.0, 300)  # a long pass: the factor is whole after RAMP_STEPS steps
    assert len(long) == 300 and long[64] == pytest.approx(0.02) and long[128:] == pytest.approx([0.03] * 172)


def test_windowed_delayed_nesterov_under_sgd_keeps_its_windowed_momentum():
    fitted = O.get("delayednesterov").for_fit(SGD(), 4, True, 32)
    assert fitted.outer.momentum == 0.0 and not fitted.sqrt_scaling
    assert fitted.local_rate_scale(SGD(), 4, True) == 1.0


@pytest.mark.parametrize("mode", ["synchronous", "asynchronous"])
@pytest.mark.parametrize("local, workers, split, scale", [
    (ADAM, 4, None, 2.0), (ADAM, 2, None, 2 ** 0.5), (ADAM, 16, None, None), (ADAM, 4, False, 1.0),
    (SGD, 4, None, 1.0)])
def test_the_plan_carries_the_factor_to_the_tasks(mode, local, workers, split, scale):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(local(1e-3), "mse")
    plan = plan_fit(Settings(mode=mode, batch_split=split), model, workers, 64, samples=10_000)
    if scale is None:  # beyond 4 workers: ramped in both modes (the asynchronous one in the round's windows)
        scale = 4.0
    warmup = scale > 2.0  # beyond 4 workers the factor ramps: the head on the driver replaces the ramp
    head = scale > 1.0  # wherever the factor is scaled the driver trains the first epoch's first steps
    assert plan.learning_rate_scale == pytest.approx(scale)
    assert plan.as_dict()["learning_rate_scale"] == pytest.approx(scale)
    assert plan.learning_rate_warmup is plan.as_dict()["learning_rate_warmup"] is False
    assert plan.head_steps == plan.as_dict()["head_steps"] == (78 if head else 0)  # half of 157 steps
    assert ("ramped up from the compiled rate over the first epoch" in plan.describe()) == warmup
    assert ("the driver trains the rows of the workers' first 78 steps of the first epoch" in plan.describe()) == head
    assert (f"sqrt({workers}) = {scale:.3g} times the compiled learning rate" in plan.describe()) == (scale != 1.0)
    assert settable_learning_rate(model.optimizer) == pytest.approx(1e-3)  # the user's model keeps its rate


@pytest.mark.parametrize("samples, frequency, windowed", [
    (10_000, None, True),      # a short pass (157 steps): the round's windows all the same beyond 4 workers
    (400_000, None, True),     # a long one
    (10_000, "epoch", False),  # one commit per pass, asked for: block momentum, the compiled rate
])
def test_beyond_four_workers_the_asynchronous_default_ramps_its_factor_only_with_windows(samples, frequency, windowed):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(ADAM(1e-3), "mse")
    plan = plan_fit(Settings(mode="asynchronous", frequency=frequency), model, 8, 64, samples=samples)
    assert (plan.window == lag_window(8)) == windowed and (plan.window is None) != windowed  # below 128 / 8
    assert plan.learning_rate_scale == pytest.approx(8 ** 0.5 if windowed else 1.0)
    assert plan.head_steps == (min(128, -(-samples // 64) // 2) if windowed else 0) and not plan.learning_rate_warmup
    assert plan.rule.outer.momentum == (0.0 if windowed else None)  # one commit per pass: block momentum 1 - 1/K
    assert ("ramped up from the compiled rate over the first epoch" in plan.describe()) == windowed
    hosted = plan_fit(Settings(mode="asynchronous", frequency=frequency), model, 8, 64, samples=samples, hosted=True)
    assert hosted.learning_rate_warmup is windowed and hosted.head_steps == 0  # a server in the tasks: the ramp


def test_a_compressed_default_scales_as_its_inner_rule():
    rule = O.Compressed("modelaveraging", "int8").for_fit(ADAM(), 4, True, 8)
    assert rule.local_rate_scale(ADAM(), 4, True) == 2.0 and rule.inner.outer.momentum == 0.0
    assert rule.local_moment(ADAM(), 4, True) == rule.inner.local_moment(ADAM(), 4, True) is not None  # beta_2 too
    asynchronous = O.Compressed("delayednesterov", "int8").for_fit(ADAM(), 8, True, 16)
    assert asynchronous.local_momentum(ADAM(), 8, True, 16) == O.local.LocalMomentum.for_lag(ADAM(), 7.0)


@pytest.mark.parametrize("name", ["modelaveraging", "delayednesterov"])
def test_sqrt_scaling_is_checked_round_trips_and_is_described(name):
    with pytest.raises(ConfigError, match=r"sqrt_scaling=1"):
        O.get(name, sqrt_scaling=1)
    rule = O.get(name, sqrt_scaling=True)
    assert type(rule).from_config(rule.get_config()) == rule
    assert O.deserialize(O.serialize(rule)) == rule
    line = rule.describe(4)
    assert "sqrt(4) = 2 times the compiled learning rate" in line and "sqrt_scaling=False turns it off" in line
    assert "times the compiled" not in O.get(name, sqrt_scaling=False).describe(4)


def test_a_number_rate_is_set_times_the_factor():
    opt = ADAM(0.01)
    worker.train_at_rate(opt, 0.01, 2.0)
    assert float(opt.learning_rate) == pytest.approx(0.02)
    worker.train_at_rate(opt, 0.01, 1.0)  # each task sets it anew from the driver's rate: never compounds
    assert float(opt.learning_rate) == pytest.approx(0.01)


@pytest.mark.parametrize("rate", [keras.optimizers.schedules.ExponentialDecay(0.01, 10, 0.5), lambda: 0.01])
def test_a_schedule_is_wrapped_once(rate):
    opt = ADAM(rate)
    worker.train_at_rate(opt, None, 1.0)
    assert float(opt.learning_rate) == pytest.approx(0.01)  # a factor of 1 leaves it alone
    worker.train_at_rate(opt, None, 3.0)
    worker.train_at_rate(opt, None, 3.0)  # the next task on the same replica
    assert float(opt.learning_rate) == pytest.approx(0.03)


def test_a_loss_scale_optimizers_inner_rate_is_scaled():
    opt = keras.optimizers.LossScaleOptimizer(ADAM(keras.optimizers.schedules.ExponentialDecay(0.01, 10, 0.5)))
    worker.train_at_rate(opt, None, 2.0)
    assert float(opt.inner_optimizer.learning_rate) == pytest.approx(0.02)


def _first_step(model, scale, data, **settings):
    """The center's move after one whole-batch Adam step of a one-worker partition trained at ``scale``."""
    model_bytes = model_to_bytes(model)
    run = f"scale-{scale}-{id(model)}"
    store = Store(model.get_weights(), O.Downpour(), "asynchronous", 1, run)
    spec = worker.TaskSpec(
        run=run, epoch=0, model_bytes=model_bytes, fingerprint=fingerprint(model_bytes), optimizer=O.Downpour(),
        window=1, batch_size=len(data[0]), mode="asynchronous", ps_url="in-process", token="t", read_timeout=5.0,
        shuffle=False, learning_rate=settable_learning_rate(model.optimizer))
    worker.run_partition(dataclasses.replace(spec, learning_rate_scale=scale, **settings), 0, 1, [data], _Direct(store))
    return [c - w for c, w in zip(store.center(), model.get_weights(), strict=True)]


class _Direct:
    def __init__(self, store):
        self.store = store

    def pull(self, worker_index, epoch=None):
        return self.store.pull(worker_index, epoch=epoch)

    def commit(self, key, attempt, commit):
        return self.store.commit(key, attempt, commit)

    def finish(self, run, epoch, partition, attempt):
        self.store.finish(run, epoch, partition, attempt)


@pytest.mark.parametrize("rate", [1e-3, keras.optimizers.schedules.ExponentialDecay(1e-3, 100, 0.9)])
def test_a_task_trains_at_the_plans_factor(rate):
    """Adam's first step moves each weight by its rate (times the sign of its gradient): the factor shows whole."""
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(64, 3)).astype("float32"), rng.normal(size=(64, 2)).astype("float32"))

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.compile(ADAM(rate), "mse")
        return m

    plain, scaled = _first_step(model(), 1.0, data), _first_step(model(), 4.0, data)
    for a, b in zip(plain, scaled, strict=True):
        moved = np.abs(a) > 1e-5
        assert moved.any()
        np.testing.assert_allclose(b[moved] / a[moved], 4.0, rtol=1e-3)


@pytest.mark.parametrize("mode, unscaled", [("synchronous", O.ModelAveraging), ("asynchronous", O.DelayedNesterov)])
def test_the_simulator_trains_at_the_plans_factor(mode, unscaled):
    """simulate_fit's workers train at the factor a Spark fit's tasks do: with the default, the center moves
    sqrt(K) times as far after Adam's first step on every worker (signs agree on this linear task)."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(256, 3)).astype("float32")
    y = (x @ np.array([[2.0, -1.0], [0.5, 1.0], [-1.5, 0.3]], "float32") + 5.0).astype("float32")

    def moved(**settings):
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.compile(ADAM(1e-3), "mse")
        start = m.get_weights()
        fit = O.simulate_fit(m, x, y, epochs=1, batch_size=256, num_workers=4, mode=mode,
                             frequency=1, shuffle=False, **settings)
        return fit, [c - s for c, s in zip(fit.centers[-1], start, strict=True)]

    default, scaled = moved()
    off, plain = moved(optimizer=unscaled(sqrt_scaling=False, outer_momentum=0.0))
    assert default.optimizer.sqrt_scaling is True and default.optimizer.outer.momentum == 0.0
    for a, b in zip(plain, scaled, strict=True):
        np.testing.assert_allclose(b, a * math.sqrt(4), rtol=1e-3)


def test_a_first_epochs_task_ramps_the_factor_over_its_pass(monkeypatch):
    """With the warm-up on, a task's first step is at the compiled rate, each next one a step closer to the
    factor; without it every step is at the factor (the first step moves the center accordingly)."""
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(64, 3)).astype("float32"), rng.normal(size=(64, 2)).astype("float32"))

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.compile(ADAM(1e-3), "mse")
        return m

    seen = []
    set_rate = backends.Stepper.set_learning_rate
    monkeypatch.setattr(backends.Stepper, "set_learning_rate", lambda self, rate: (seen.append(rate),
                                                                                    set_rate(self, rate)))
    m = model()
    model_bytes = model_to_bytes(m)
    store = Store(m.get_weights(), O.Downpour(), "asynchronous", 1, "ramp")
    spec = worker.TaskSpec(
        run="ramp", epoch=0, model_bytes=model_bytes, fingerprint=fingerprint(model_bytes), optimizer=O.Downpour(),
        window=1, batch_size=16, mode="asynchronous", ps_url="in-process", token="t", read_timeout=5.0,
        shuffle=False, learning_rate=1e-3, learning_rate_scale=4.0, learning_rate_warmup=True)
    stats = worker.run_partition(spec, 0, 1, [data], _Direct(store))[0]
    assert seen == pytest.approx([1e-3, 1.75e-3, 2.5e-3, 3.25e-3])  # 4 steps of 16
    assert stats["learning_rate"] == pytest.approx(1e-3)
    assert worker.pass_rates(dataclasses.replace(spec, learning_rate_warmup=False), 64) is None
    assert worker.pass_rates(dataclasses.replace(spec, learning_rate=None), 64) is None  # a schedule: not ramped

    whole = (data[0], data[1])
    plain, ramped = _first_step(model(), 1.0, whole), _first_step(model(), 4.0, whole, learning_rate_warmup=True)
    for a, b in zip(plain, ramped, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-7)  # a one-step pass trains at the compiled rate


def test_without_a_head_the_simulator_ramps_the_factor_in_the_first_epoch_only(monkeypatch):
    monkeypatch.setattr(head, "HEAD_STEPS", 0)  # as a plan without a head (a server in the tasks) ramps
    seen = []
    set_rate = backends.Stepper.set_learning_rate
    monkeypatch.setattr(backends.Stepper, "set_learning_rate", lambda self, rate: (seen.append(round(rate, 9)),
                                                                                    set_rate(self, rate)))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(256, 3)).astype("float32")
    y = x @ np.array([[2.0, -1.0], [0.5, 1.0], [-1.5, 0.3]], "float32")
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    m.compile(ADAM(1e-3), "mse")
    fit = O.simulate_fit(m, x, y, epochs=3, batch_size=64, num_workers=16, mode="synchronous", shuffle=False)
    assert fit.optimizer.sqrt_scaling is True
    ramp = [round(r, 9) for r in ramped_rates(1e-3, 4.0, 4)]  # 16 samples per worker, batches of 4
    assert fit.window == 8 and plan_fit(Settings(mode="synchronous"), m, 16, 64, 256).warmup_window == 2
    # each worker's first pass climbs, in the warm-up's rounds of 2 steps each; its second is at the factor
    assert seen == ramp[:2] * 16 + ramp[2:] * 16 + [round(4e-3, 9)] * 16


# ---------------------------------------------------------------- the workers' longer second moment (LocalMoment)
@pytest.mark.parametrize("local, workers, expected", [
    (RMSPROP(rho=0.9), 8, ("rho", 0.9875, False)),          # RMSprop leaves its start uncorrected: the rate does it
    (ADAM(beta_2=0.999), 4, ("beta_2", 0.99975, True)),
    (keras.optimizers.AdamW(), 2, ("beta_2", 0.9995, True)),
    (keras.optimizers.LossScaleOptimizer(RMSPROP()), 2, ("rho", 0.95, False)),  # its inner optimizer's
    (SGD(momentum=0.9), 8, None),                           # no running magnitude
    (keras.optimizers.Adamax(), 8, None),                   # an infinity norm: not measured, left as compiled
    (ADAM(), 1, None),
])
def test_the_workers_decay_averages_k_times_the_steps(local, workers, expected):
    moment = O.local.LocalMoment.for_workers(local, workers)
    if expected is None:
        assert moment is None
    else:
        assert (moment.name, moment.decay, moment.corrects_bias) == pytest.approx(expected)


@pytest.mark.parametrize("name", ["modelaveraging", "delayednesterov"])
@pytest.mark.parametrize("local, workers, split, given, windowed, on", [
    (RMSPROP(1e-3), 8, True, {}, True, True),               # the default, wherever the rate is scaled
    (ADAM(1e-3), 2, True, {}, False, True),
    (RMSPROP(1e-3), 8, False, {}, True, False),             # full batches per worker: no scaling, no decay
    (RMSPROP(1e-3), 8, True, {"decay_scaling": False}, True, False),
    (RMSPROP(1e-3), 2, True, {"sqrt_scaling": False}, True, False),
    (RMSPROP(1e-3), 2, True, {"sqrt_scaling": False, "decay_scaling": True}, True, True),  # forced
    (SGD(0.01), 8, True, {"decay_scaling": True}, True, False),                           # nothing to spread
    # a schedule: RMSprop's start rises at its compiled decay, whatever the rate; Adam corrects its own
    (RMSPROP(keras.optimizers.schedules.ExponentialDecay(1e-3, 10, 0.9)), 2, True, {}, True, True),
    (ADAM(keras.optimizers.schedules.ExponentialDecay(1e-3, 10, 0.9)), 2, True, {}, True, True),
])
def test_the_plan_decides_the_workers_decay(name, local, workers, split, given, windowed, on):
    rule = O.get(name, **given)
    fitted = rule.for_fit(local, workers, split, 16 if windowed else None)
    moment = fitted.local_moment(local, workers, split)
    assert (moment is not None) is on
    with pytest.raises(ConfigError, match=r"decay_scaling='yes'"):
        O.get(name, decay_scaling="yes")
    forced = O.get(name, decay_scaling=True)
    assert type(forced).from_config(forced.get_config()) == forced


def test_the_plan_carries_and_describes_the_workers_decay():
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    m.compile(RMSPROP(1e-3), "mse")
    plan = plan_fit(Settings(mode="synchronous"), m, 8, 64, 100_000)
    assert plan.local_moment == O.local.LocalMoment("rho", 0.9875, 0.9, False)
    assert plan.as_dict()["local_moment"] == {"name": "rho", "decay": 0.9875, "compiled": 0.9, "corrects_bias": False}
    assert "with rho 0.9875 instead of 0.9" in plan.describe() and "decay_scaling=False" in plan.describe()
    off = plan_fit(Settings(mode="synchronous", optimizer=O.ModelAveraging(decay_scaling=False)), m, 8, 64, 100_000)
    assert off.local_moment is None and off.as_dict()["local_moment"] is None and "rho" not in off.describe()


def _velocities(moment, gradients, rho=0.9):
    """RMSprop's running magnitude of one variable after each of ``gradients`` (Keras' own steps)."""
    var = keras.Variable(np.zeros(len(gradients[0]), "float32"))
    opt = RMSPROP(1e-3, rho=rho)
    opt.build([var])
    if moment is not None:
        moment.apply(opt)
        moment.apply(opt)  # a replica built again keeps one hook
    out = []
    for g in gradients:
        opt.apply([np.asarray(g, "float32")], [var])
        out.append(keras.ops.convert_to_numpy(opt._velocities[0]).copy())
    return out


def test_rmsprop_workers_magnitude_averages_longer_and_rises_at_the_compiled_decay():
    """At 8 workers the magnitude decays at 0.9875; where a squared gradient exceeds 1/(1 - 0.9) = 10 times it,
    it rises at 0.9 instead: from zero at the first step, and at a sudden growth, coordinate by coordinate."""
    moment = O.local.LocalMoment.for_workers(RMSPROP(), 8)
    assert moment.rise_ratio == pytest.approx(10.0) and O.local.LocalMoment.for_workers(ADAM(), 8).rise_ratio is None
    gradients = [[1.0, 1.0], [0.9, 0.9], [1.0, 0.5], [1.0, 20.0], [1.0, 0.1]]
    expected, v = [], np.zeros(2)
    for g in np.square(gradients):
        decay = np.where(g > 10 * v, 0.9, 0.9875)
        v = decay * v + (1 - decay) * g
        expected.append(v)
    got = _velocities(moment, gradients)
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert got[0] == pytest.approx([0.1, 0.1]) and got[1][0] == pytest.approx(0.9875 * 0.1 + 0.0125 * 0.81)
    assert got[3][1] > 0.1 * 400  # the growth took a tenth of the new square at once, not an eightieth
    np.testing.assert_allclose(_velocities(None, gradients[:1]), [[0.1, 0.1]], rtol=1e-6)  # as compiled at first


def test_a_growing_gradient_moves_the_workers_rmsprop_no_further_than_the_compiled_one_can():
    """A gradient that grows 100-fold after 200 steady steps: the longer decay alone would step 1/sqrt(80) times
    the growth's size relative to its magnitude (about 9 times the rate); rising, the step stays within
    1/sqrt(1 - rho) = 3.2 times the rate, the compiled RMSprop's largest."""
    def last_step(moment):
        var = keras.Variable(np.zeros(1, "float32"))
        opt = RMSPROP(1.0)
        opt.build([var])
        if moment is not None:
            moment.apply(opt)
        else:
            opt.rho = 0.9875
        before = None
        for g in [0.1] * 200 + [10.0]:
            before = keras.ops.convert_to_numpy(var).copy()
            opt.apply([np.array([g], "float32")], [var])
        return float(abs(keras.ops.convert_to_numpy(var)[0] - before[0]))

    assert last_step(None) > 8.0
    assert last_step(O.local.LocalMoment.for_workers(RMSPROP(), 8)) <= 1 / math.sqrt(0.1) + 1e-3


def test_a_task_trains_with_the_workers_decay_and_a_first_step_of_the_compiled_size():
    """RMSprop at rho 0.9875 would take a first step of 1/sqrt(0.0125) = 8.9 times its rate; its magnitude rising
    from zero at the compiled 0.9, the first step is the compiled RMSprop's, 1/sqrt(0.1) times the rate; the
    replica's optimizer holds the workers' rho, and no pass changes its rate for it."""
    rng = np.random.default_rng(0)
    data = (rng.normal(size=(64, 3)).astype("float32"), rng.normal(size=(64, 2)).astype("float32"))

    def model():
        keras.utils.set_random_seed(0)
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.compile(RMSPROP(1e-3), "mse")
        return m

    moment = O.local.LocalMoment.for_workers(RMSPROP(), 8)
    plain, longer = _first_step(model(), 1.0, data), _first_step(model(), 1.0, data, local_moment=moment)
    for a, b in zip(plain, longer, strict=True):
        moved = np.abs(a) > 1e-6
        assert moved.any()
        np.testing.assert_allclose(np.abs(a[moved]), 1e-3 / math.sqrt(0.1), rtol=1e-2)  # RMSprop's own start
        np.testing.assert_allclose(np.abs(b[moved]), 1e-3 / math.sqrt(0.1), rtol=1e-2)
    spec = worker.TaskSpec(
        run="moment", epoch=0, model_bytes=model_to_bytes(model()), fingerprint="f", optimizer=O.Downpour(),
        window=1, batch_size=64, mode="asynchronous", ps_url="in-process", token="t", read_timeout=5.0,
        local_moment=moment)
    from elephant.replicas import training_model

    replica = training_model(spec).optimizer
    assert float(replica.rho) == pytest.approx(0.9875) and replica._rises_at_compiled_decay
    assert worker.pass_rates(dataclasses.replace(spec, learning_rate=1e-3), 128) is None  # one rate throughout


def test_the_simulator_trains_with_the_workers_decay_as_the_tasks_do(monkeypatch):
    """simulate_fit's replicas take the plan's decay and its rise as a task's replica does, each its own; no
    pass changes their rate for it (two workers: no ramp)."""
    seen, applied = [], []
    set_rate = backends.Stepper.set_learning_rate
    monkeypatch.setattr(backends.Stepper, "set_learning_rate", lambda self, rate: (seen.append(rate),
                                                                                    set_rate(self, rate)))
    apply = O.local.LocalMoment.apply
    monkeypatch.setattr(O.local.LocalMoment, "apply", lambda self, local: (applied.append((self, local)),
                                                                          apply(self, local)))
    rng = np.random.default_rng(1)
    x = rng.normal(size=(64, 3)).astype("float32")
    y = x @ np.array([[2.0, -1.0], [0.5, 1.0], [-1.5, 0.3]], "float32")
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    m.compile(RMSPROP(1e-3), "mse")
    fit = O.simulate_fit(m, x, y, epochs=2, batch_size=16, num_workers=2, mode="synchronous", shuffle=False,
                         share_model=False)
    assert fit.optimizer.sqrt_scaling is True and seen == []
    assert [moment for moment, _ in applied] == [O.local.LocalMoment("rho", 0.95, 0.9, False)] * 2
    assert all(float(local.rho) == pytest.approx(0.95) and local._rises_at_compiled_decay for _, local in applied)
    assert float(m.optimizer.rho) == pytest.approx(0.9) and not hasattr(m.optimizer, "_rises_at_compiled_decay")


@pytest.mark.parametrize("local", [ADAM(1e-3), keras.optimizers.AdamW(1e-3), ADAM(1e-3, amsgrad=True)])
def test_a_replica_of_a_model_that_took_steps_starts_from_its_corrected_magnitude(local):
    """A task's replica built from the archive of a model whose Adam took t steps at beta_2 (the driver's head)
    holds v summed at beta_2; at the workers' longer beta_2 it is restated, so that v/(1 − beta_2'^t) is the
    v/(1 − beta_2^t) the optimizer had, and the workers' next step is about the one the compiled optimizer
    would take (unrestated it would be about sqrt(15) times smaller after 128 steps at 16 workers)."""
    rng = np.random.default_rng(3)
    data = (rng.normal(size=(128 * 8, 3)).astype("float32"), rng.normal(size=(128 * 8, 2)).astype("float32"))
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    m.compile(local, "mse")
    m.fit(*data, batch_size=8, epochs=1, shuffle=False, verbose=0)  # 128 steps
    t = int(m.optimizer.iterations)
    held = [np.array(v) for v in m.optimizer._velocities]
    moment = O.local.LocalMoment.for_workers(m.optimizer, 16)
    spec = worker.TaskSpec(
        run=f"restated-{type(local).__name__}-{local.amsgrad}", epoch=0, model_bytes=model_to_bytes(m),
        fingerprint="f", optimizer=O.Downpour(), window=1, batch_size=8, mode="asynchronous", ps_url="in-process",
        token="t", read_timeout=5.0, local_moment=moment)
    from elephant.replicas import training_model

    replica = training_model(spec)
    assert int(replica.optimizer.iterations) == t == 128
    for before, after in zip(held, replica.optimizer._velocities, strict=True):
        np.testing.assert_allclose(np.array(after) / (1 - moment.decay ** t), before / (1 - 0.999 ** t), rtol=1e-4)
    batch = (data[0][:8], data[1][:8])
    compiled = keras.models.clone_model(m)
    compiled.compile(type(local).from_config(local.get_config()), "mse")
    compiled.optimizer.build(compiled.trainable_variables)
    for source, target in zip(m.optimizer.variables, compiled.optimizer.variables, strict=True):
        target.assign(source)
    compiled.set_weights(m.get_weights())
    replica.set_weights(m.get_weights())
    start = [np.array(w) for w in m.get_weights()]
    compiled.train_on_batch(*batch)
    replica.train_on_batch(*batch)
    for s, a, b in zip(start, compiled.get_weights(), replica.get_weights(), strict=True):
        np.testing.assert_allclose(b - s, a - s, rtol=0.05, atol=1e-7)


def test_a_fresh_optimizer_is_left_as_it_is_by_the_restatement():
    optimizer = ADAM(1e-3)
    O.local.restate_corrected_magnitude(optimizer, 0.9999, 0.999)  # not built, no steps: nothing to restate
    assert not optimizer.built
