"""Every registered distributed optimizer trains the digits MLP end to end over HTTP."""

import pytest

from elephant import SparkModel
from elephant import optimizers as O

from .helpers import accuracy, digits_model

# name -> (frequency, local optimizer, epochs). Normalising rules (AGN, ADAG) commit one
# *average* step per window, so they get a shorter window and a larger learning rate;
# DC-ASGD recovers a gradient as -delta/learning_rate; with Adam that "gradient" is the
# Adam step over η, so the compensation is approximate (exact only with plain SGD), but
# it trains steadily, while plain SGD at window 1 varied between 0.88 and 0.97 across runs.
SETTINGS = {
    "modelaveraging": (8, ("adam", 3e-3), 8),
    "easgd": (8, ("adam", 3e-3), 8),
    "downpour": (5, ("adam", 2e-3), 10),
    "dynsgd": (5, ("adam", 2e-3), 8),  # 6 epochs: 0.96-0.97 alone, 0.88 once with the CPU shared by another job
    "agn": (2, ("adam", 5e-3), 8),
    "adag": (2, ("adam", 5e-3), 8),
    "aeasgd": (8, ("adam", 3e-3), 8),
    "eamsgd": (8, ("nesterov", 0.05), 12),
    "dcasgd": ("batch", ("adam", 2e-3), 8),
    # windows, not its inner default's one commit per pass: two tasks' single commits overlap only when Spark
    # starts them together, so a pass of several commits is what makes some of them stale every run
    "compressed": (8, ("adam", 2e-3), 10),
}


def _compile(model, local):
    import keras

    kind, lr = local
    if kind == "adam":
        opt = keras.optimizers.Adam(lr)
    elif kind == "nesterov":
        opt = keras.optimizers.SGD(lr, momentum=0.9, nesterov=True)
    else:
        opt = keras.optimizers.SGD(lr)
    model.compile(opt, "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


# A newly registered rule runs with its own default window and these until it gets a row.
DEFAULT_SETTINGS = (None, ("adam", 2e-3), 10)


@pytest.mark.parametrize("name", O.registered_names())
def test_optimizer_trains_digits(spark, digits, name):
    x_train, x_test, y_train, y_test = digits
    frequency, local, epochs = SETTINGS.get(name, DEFAULT_SETTINGS)
    optimizer = O.get(name, learning_rate=local[1]) if name == "dcasgd" else O.get(name)
    mode = "synchronous" if "synchronous" in optimizer.modes else "asynchronous"
    sm = SparkModel(_compile(digits_model(), local), mode=mode, frequency=frequency, optimizer=optimizer,
                    num_workers=2, spark=spark)
    history = sm.fit(x_train, y_train, epochs=epochs, batch_size=32, verbose=0)
    acc = accuracy(sm.model, x_test, y_test)
    print(f"{name}: test accuracy {acc:.3f} after {epochs} epochs, {sm.last_metrics['commits_applied']} commits")
    # Asynchronous rules end where the commits' interleaving takes them: 0.953-0.976 for every rule with both
    # cores busy beside two runs (scripts/suite_under_load.py), DOWNPOUR once 0.898 with a benchmark beside it.
    # The bar sits below that tail and far above chance (0.10); each rule's arithmetic is pinned in tests/unit.
    assert acc >= 0.85, f"{name}: test accuracy {acc:.3f}"
    if mode == "asynchronous":
        # A commit's staleness is the server clock when it is applied minus the clock of the center it
        # was trained from. Whether two workers' commits overlap is up to the machine's load (on a loaded
        # machine one task's short pass can end before the other's starts, in every epoch), so the history
        # is checked against the server's own record: an epoch's mean is stale exactly when some commit
        # was, and never above the largest staleness the server recorded.
        staleness, largest = history.history["staleness"], sm.last_metrics["staleness_max"]
        assert len(staleness) == epochs, staleness
        assert (max(staleness) > 0) == (largest > 0), (name, staleness, largest)
        assert max(staleness) <= largest, (staleness, largest)
