"""How far ``simulate_fit`` goes on one machine: time and peak memory at 2 to 64 simulated workers.

Each run is a fresh process (so its peak resident memory is its own): one epoch of a
workload of ``benchmarks/workloads.py`` with the asynchronous default, at each worker count,
beside the time of plain Keras' epoch. The workers share one Keras model (``simulate_fit``'s
default); ``--compare`` also runs each count with a model per worker (``share_model=False``).
Results go to ``results/sim_scale.json``.

Run::

    python benchmarks/sim_scale.py                                  # waves-conv1d and teacher-mlp-5mb
    python benchmarks/sim_scale.py --workloads waves-conv1d --workers 16 32 64 --compare
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")


def one(workload: str, workers: int, share_model: bool = True) -> dict:
    """Run in a child process: one simulated epoch; its seconds, peak memory and the center's metric."""
    import resource

    sys.path.insert(0, HERE)
    import workloads as WL
    from elephant.optimizers import simulate_fit

    wl = WL.make(workload)
    t0 = time.perf_counter()
    if workers == 0:  # plain Keras, the reference
        model = wl.build(0)
        model.fit(wl.x, wl.y, batch_size=wl.batch_size, epochs=1, verbose=0)
        metric = model.evaluate(wl.x_test, wl.y_test, verbose=0, return_dict=True)[wl.metric]
        window = None
    else:
        fit = simulate_fit(wl.build(0), wl.x, wl.y, epochs=1, batch_size=wl.batch_size, num_workers=workers, seed=0,
                           validation_data=(wl.x_test, wl.y_test), share_model=share_model)
        metric, window = fit.history["val_" + wl.metric][-1], fit.window
    return {"workload": workload, "workers": workers, "share_model": share_model if workers else None,
            "seconds": time.perf_counter() - t0, "metric": float(metric),
            "window": window, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}


def _key(row: dict) -> tuple:
    return row["workload"], row["workers"], str(row["share_model"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=["waves-conv1d", "teacher-mlp-5mb"])
    parser.add_argument("--workers", nargs="+", type=int, default=[2, 8, 16, 32, 64])
    parser.add_argument("--compare", action="store_true", help="also run a Keras model per worker")
    parser.add_argument("--child", nargs=3, metavar=("WORKLOAD", "WORKERS", "SHARE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(one(args.child[0], int(args.child[1]), args.child[2] == "shared")))
        return
    path = os.path.join(RESULTS, "sim_scale.json")
    kept = {}
    if os.path.exists(path):  # rows of other workloads and worker counts stay; these are measured again
        with open(path) as f:
            for row in json.load(f)["rows"]:  # rows from before the shared model had a model per worker
                row.setdefault("share_model", False if row["workers"] else None)
                kept[_key(row)] = row
    rows = []
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    runs = [(0, "shared")] + [(k, share) for k in args.workers for share in ("shared", "apart")[:1 + args.compare]]
    for workload in args.workloads:
        for workers, share in runs:
            done = subprocess.run([sys.executable, __file__, "--child", workload, str(workers), share], env=env,
                                  capture_output=True, text=True)
            label = f"{workload} K={workers or 'plain'}{'' if not workers else f' ({share})'}"
            if done.returncode != 0:
                rows.append({"workload": workload, "workers": workers, "share_model": share == "shared",
                             "error": done.stderr[-2000:]})
                print(f"{label}: failed\n{done.stderr[-2000:]}", flush=True)
                continue
            row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(f"{label}: {row['seconds']:.1f} s, peak {row['peak_rss_mb']:.0f} MB, "
                  f"{row['metric']:.4f} (window {row['window']})", flush=True)
    os.makedirs(RESULTS, exist_ok=True)
    kept.update({_key(r): r for r in rows})
    meta = {"python": platform.python_version(), "cpus": os.cpu_count(), "time": time.strftime("%Y-%m-%d %H:%M")}
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": sorted(kept.values(), key=_key)}, f,
                  indent=1)


if __name__ == "__main__":
    main()
