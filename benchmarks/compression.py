"""Accuracy of compressed commits: each mode's default rule uncompressed, with bf16 and with int8 blocks.

For each workload (``benchmarks/workloads.py``) and worker count, trains with the in-process
simulator (:func:`elephant.optimizers.simulate_fit`, one Keras replica per worker, no Spark)

* ``async-default`` and ``sync-default``: the asynchronous and synchronous defaults as
  ``SparkModel`` runs them (DelayedNesterov, ModelAveraging), and
* the same rules wrapped in ``Compressed(inner, codec)`` with ``bf16`` and with ``int8``
  (per-block scales, blocks of 256), error feedback on, and for the synchronous default
  also with ``replies=True`` (``bf16+r``, ``int8+r``: each round's reply travels as the
  encoded change of the workers' view of the center),

from the same initial weights and shard split, plus plain Keras ``model.fit``, and records
the test metric of the center after the last epoch and the bytes of one commit on the wire
(``elephant.ps.wire.encode_commit`` of the payload, header included). The window each fit runs is
the plan's (the wrapper keeps the inner rule's, so compression changes only the payload).

Run::

    python benchmarks/compression.py                                  # digits + textures, 2 and 4 workers
    python benchmarks/compression.py --workloads digits-mlp --workers 2 --seeds 0
    python benchmarks/compression.py --report                         # table and plot from saved rows
    python benchmarks/compression.py --configs sync-default --codecs none int8 int8+r bf16+r \
        --results compression_replies                                # compressed replies, side by side

Results go to ``benchmarks/results/compression.json`` (``--results NAME``: ``NAME.json``; rows
already there are kept and skipped, so an interrupted run resumes) and the plot beside it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
RESULTS = os.path.join(HERE, "results")
PATH = os.path.join(RESULTS, "compression.json")  # --results replaces it

import workloads as WL  # noqa: E402

logger = logging.getLogger("compression")

MODES = {"async-default": "asynchronous", "sync-default": "synchronous"}
CODECS = {"none": None, "bf16": {"codec": "bf16"}, "int8": {"codec": "int8", "block": 256},
          "bf16+r": {"codec": "bf16", "replies": True}, "int8+r": {"codec": "int8", "block": 256, "replies": True}}
#: Codecs that compress replies too: synchronous rounds only.
SYNC_ONLY = ("bf16+r", "int8+r")


def optimizer_for(mode: str, codec: str):
    """The mode's default rule, wrapped in ``Compressed`` unless ``codec == "none"``."""
    from elephant.config import default_optimizer

    inner = default_optimizer(mode)
    if CODECS[codec] is None:
        return inner
    return {"name": "compressed", "config": {"inner": inner, **CODECS[codec]}}


def commit_bytes(model, optimizer) -> int:
    """Bytes of one commit of ``model``'s weights under ``optimizer`` on the wire (header included)."""
    from elephant.optimizers import get
    from elephant.ps import wire
    from elephant.protocol import Commit, CommitKey

    template = get(optimizer).commit_template(model.get_weights())
    commit = Commit([t.copy() for t in template], 1, 1, 0)
    return len(wire.encode_commit(CommitKey("r", 0, 0, 0), 0, commit))


def plain_keras(wl, seed: int) -> dict:
    model = wl.build(seed)
    t0 = time.perf_counter()
    model.fit(wl.x, wl.y, batch_size=wl.batch_size, epochs=wl.epochs, verbose=0, shuffle=True)
    logs = model.evaluate(wl.x_test, wl.y_test, batch_size=wl.batch_size, verbose=0, return_dict=True)
    return {"final": wl.score(logs), "seconds": time.perf_counter() - t0}


def run_one(wl, mode: str, codec: str, workers: int, seed: int) -> dict:
    from elephant.optimizers import simulate_fit

    optimizer = optimizer_for(mode, codec)
    model = wl.build(seed)
    t0 = time.perf_counter()
    fit = simulate_fit(model, wl.x, wl.y, epochs=wl.epochs, batch_size=wl.batch_size, num_workers=workers,
                       seed=seed, mode=mode, optimizer=optimizer, validation_data=(wl.x_test, wl.y_test))
    curve = fit.history["val_" + wl.metric]
    return {"curve": curve, "final": curve[-1], "seconds": time.perf_counter() - t0, "window": fit.window,
            "updates": int(sum(fit.history["updates"])), "optimizer": repr(fit.optimizer),
            "commit_bytes": commit_bytes(model, optimizer)}


def _key(row) -> tuple:
    return (row["workload"], row["config"], row["codec"], row["workers"], row["seed"])


def _load() -> dict:
    if not os.path.exists(PATH):
        return {}
    with open(PATH) as f:
        return {_key(r): r for r in json.load(f)["rows"]}


def _save(done: dict) -> None:
    os.makedirs(RESULTS, exist_ok=True)
    meta = {"engine": "sim", "python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%d %H:%M")}
    with open(PATH + ".tmp", "w") as f:
        json.dump({"meta": meta, "rows": sorted(done.values(), key=lambda r: tuple(map(str, _key(r))))}, f, indent=1)
    os.replace(PATH + ".tmp", PATH)


def run(args) -> dict:
    done = _load()
    for name in args.workloads:
        wl = WL.make(name)
        for seed in args.seeds:
            key = (name, "plain", "none", 0, seed)
            if key not in done:
                done[key] = {"workload": name, "config": "plain", "codec": "none", "workers": 0, "seed": seed,
                             **plain_keras(wl, seed)}
                logger.info("%s seed %d plain keras %.4f", name, seed, done[key]["final"])
                _save(done)
            for workers in args.workers:
                for config, mode in MODES.items():
                    if config not in args.configs:
                        continue
                    for codec in args.codecs:
                        key = (name, config, codec, workers, seed)
                        if key in done or (codec in SYNC_ONLY and mode != "synchronous"):
                            continue
                        row = {"workload": name, "config": config, "codec": codec, "workers": workers, "seed": seed}
                        try:
                            row.update(run_one(wl, mode, codec, workers, seed))
                        except Exception as exc:  # noqa: BLE001 - one failed run must not lose the others
                            traceback.print_exc()
                            row["error"] = f"{type(exc).__name__}: {exc}"
                        done[key] = row
                        logger.info("%s K=%d %s %s: %.4f in %.1fs", name, workers, config, codec,
                                    row.get("final", float("nan")), row.get("seconds", float("nan")))
                        _save(done)
    return done


def table(done: dict) -> str:
    """A markdown table: the final metric per codec and its difference to uncompressed, plus commit bytes."""
    lines = ["| workload | K | rule | seed | plain Keras | none | bf16 (Δ) | int8/256 (Δ) | bf16+r (Δ) | int8+r (Δ) "
             "| commit bytes none / bf16 / int8 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = [r for r in done.values() if r["config"] != "plain"]
    cells = sorted({(r["workload"], r["workers"], r["config"], r["seed"]) for r in rows})
    for workload, workers, config, seed in cells:
        plain = done.get((workload, "plain", "none", 0, seed), {}).get("final", float("nan"))
        got = {c: done.get((workload, config, c, workers, seed), {}) for c in CODECS}
        base = got["none"].get("final", float("nan"))
        fmt = {c: (f"{got[c]['final']:.4f}" if "final" in got[c] else got[c].get("error", "–")[:30]) for c in CODECS}
        delta = {c: (f" ({got[c]['final'] - base:+.4f})" if "final" in got[c] else "") for c in CODECS}
        sizes = " / ".join(f"{got[c].get('commit_bytes', 0) / 2**20:.3f}" if got[c].get("commit_bytes", 0) > 2**20
                           else f"{got[c].get('commit_bytes', 0):,}" for c in ("none", "bf16", "int8"))
        cols = " | ".join(f"{fmt[c]}{delta[c]}" for c in ("bf16", "int8", "bf16+r", "int8+r"))
        lines.append(f"| {workload} | {workers} | {config} | {seed} | {plain:.4f} | {fmt['none']} | {cols} | {sizes} |")
    return "\n".join(lines)


def plot(done: dict) -> None:
    try:
        import matplotlib
    except ImportError:
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in done.values() if r["config"] != "plain" and "final" in r]
    workloads = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(1, len(workloads), figsize=(5.5 * len(workloads), 4), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        cells = sorted({(r["config"], r["workers"]) for r in rows if r["workload"] == workload})
        for i, codec in enumerate(CODECS):
            values = [done.get((workload, c, codec, k, 0), {}).get("final", float("nan")) for c, k in cells]
            ax.bar([j + (i - 2) * 0.17 for j in range(len(cells))], values, width=0.17, label=codec)
        plain = done.get((workload, "plain", "none", 0, 0), {}).get("final")
        if plain is not None:
            ax.axhline(plain, color="k", lw=1, ls="--", label="plain Keras")
        finals = [r["final"] for r in rows if r["workload"] == workload] + ([plain] if plain else [])
        ax.set_ylim(min(finals) - 0.05, max(finals) + 0.02)
        ax.set_xticks(range(len(cells)), [f"{c.split('-')[0]} K={k}" for c, k in cells])
        ax.set_title(workload)
        ax.set_ylabel("test accuracy after the last epoch")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(PATH.removesuffix(".json") + ".png", dpi=90)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("elephant").setLevel(logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["digits-mlp", "textures-conv2d"], choices=list(WL.NAMES))
    parser.add_argument("--workers", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--codecs", nargs="+", default=["none", "bf16", "int8"], choices=list(CODECS))
    parser.add_argument("--configs", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--results", default="compression", help="name of the results file in benchmarks/results")
    parser.add_argument("--report", action="store_true", help="only print the table and draw the plot from saved rows")
    args = parser.parse_args()
    PATH = os.path.join(RESULTS, args.results + ".json")
    results = _load() if args.report else run(args)
    logger.info("\n%s", table(results))
    plot(results)
