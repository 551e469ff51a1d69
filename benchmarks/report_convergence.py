"""Tables and plots from ``results/convergence_{sim,spark}.json`` (see ``convergence.py``).

``python benchmarks/report_convergence.py`` writes ``results/convergence.md`` (one table per
engine: mean final metric over seeds, its spread, the delta to plain Keras, the epochs to reach
plain Keras' final metric within one point, the time ratio for Spark rows) and one PNG per
workload with the center's test metric after every epoch beside plain Keras'.
"""

from __future__ import annotations

import glob
import json
import os
from collections import defaultdict

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

# Targets of the accuracy-parity work: defaults within 1 point (5 % relative for a loss),
# named rules within 2 points.
DEFAULTS = ("sync-default", "sync-w8", "sync-epoch", "async-default", "async-epoch")


def _load(engine: str) -> list[dict]:
    """Rows of ``convergence_<engine>.json`` and of its tagged parts (``convergence_<engine>_<tag>.json``); where
    several files hold the same workload, configuration, workers and seed, the most recent run's row (``meta.time``)."""
    rows, files = {}, []
    for path in glob.glob(os.path.join(RESULTS, f"convergence_{engine}*.json")):
        with open(path) as f:
            data = json.load(f)
        files.append((str((data.get("meta") or {}).get("time", "")), path, data["rows"]))
    for _, _, found in sorted(files):
        # plain Keras' wall time varies between runs (up to 1.6x on this VM): a row's time ratio
        # is taken against the plain fit of its own run, where that run has one
        walls = {(r["workload"], r["seed"]): r["wall"] for r in found if r["config"] == "plain" and "wall" in r}
        for row in found:
            if row["config"] != "plain" and (row["workload"], row["seed"]) in walls:
                row["plain_wall_same_run"] = walls[(row["workload"], row["seed"])]
            rows[(row["workload"], row["config"], row["workers"], row["seed"])] = row
    return list(rows.values())


def _higher_is_better(workload: str) -> bool:
    return "regression" not in workload


def gap(workload: str, value: float, reference: float) -> float:
    """Signed shortfall against plain Keras: accuracy points, or percent of the loss (positive = better)."""
    if _higher_is_better(workload):
        return 100.0 * (value - reference)
    return 100.0 * (reference - value) / reference


def meets(workload: str, config: str, value: float, reference: float) -> bool:
    return gap(workload, value, reference) >= -(1.0 if config in DEFAULTS else 2.0) * (
        1.0 if _higher_is_better(workload) else 5.0)


def _epochs_to_reach(workload: str, curve: list[float], reference: float) -> int | None:
    for epoch, value in enumerate(curve, 1):
        if (_higher_is_better(workload) and value >= reference - 0.01) or (
            not _higher_is_better(workload) and value <= reference * 1.05
        ):
            return epoch
    return None


def _plain_fits(rows: list[dict]) -> dict:
    """``(workload, seed) -> finals`` of plain Keras where other shuffle orders were measured (``--plain-orders``):
    the reference fit first, then the orders'."""
    plain = {(r["workload"], r["seed"]): r["final"] for r in rows if r["config"] == "plain"}
    return {(r["workload"], r["seed"]): np.array([plain[(r["workload"], r["seed"])], *r["finals"]])
            for r in sorted(rows, key=lambda r: (r["workload"], r["seed"]))
            if r["config"] == "plain-orders" and (r["workload"], r["seed"]) in plain}


def summarise(rows: list[dict]) -> dict:
    """``(workload, config, workers) -> stats`` over seeds, with plain Keras on the same seeds."""
    plain = {(r["workload"], r["seed"]): r for r in rows if r["config"] == "plain"}
    # plain Keras' mean over shuffle orders (the reference fit and ``--plain-orders``), where measured
    orders = {key: float(finals.mean()) for key, finals in _plain_fits(rows).items()}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r["config"] != "plain" and "final" in r and (r["workload"], r["seed"]) in plain:
            groups[(r["workload"], r["config"], r["workers"])].append(r)
    out = {}
    for (workload, config, workers), runs in groups.items():
        finals = np.array([r["final"] for r in runs])
        refs = np.array([plain[(workload, r["seed"])]["final"] for r in runs])
        gaps = np.array([gap(workload, f, p) for f, p in zip(finals, refs)])
        reach = [_epochs_to_reach(workload, r["curve"], plain[(workload, r["seed"])]["final"]) for r in runs]
        # both sides evaluate the test set after every epoch: compare fit + evaluation wall times
        ratios = [r["seconds"] / r.get("plain_wall_same_run", plain[(workload, r["seed"])]["wall"])
                  for r in runs if r.get("engine") == "spark"]
        over_orders = [gap(workload, r["final"], orders[(workload, r["seed"])]) for r in runs
                       if (workload, r["seed"]) in orders]
        out[(workload, config, workers)] = {
            "final": float(finals.mean()), "spread": float(finals.max() - finals.min()),
            "plain": float(refs.mean()), "gap": float(gaps.mean()), "seeds": len(runs),
            "reach": None if None in reach else float(np.mean(reach)),
            "ratio": float(np.mean(ratios)) if ratios else None,
            "meets": meets(workload, config, float(finals.mean()), float(refs.mean())),
            "gap_orders": float(np.mean(over_orders)) if len(over_orders) == len(runs) else None,
            "curve": np.mean([r["curve"] for r in runs], axis=0).tolist(),
            "plain_curve": np.mean([plain[(workload, r["seed"])]["curve"] for r in runs], axis=0).tolist(),
        }
    return out


def table(summary: dict, engine: str) -> str:
    lines = [
        f"### {engine}",
        "",
        "Mean over seeds of the final test metric (accuracy; MSE for the regression), its spread "
        "(max − min), the gap to plain Keras on the same seeds (accuracy points, or percent of the "
        "loss; negative = worse), the epochs until the center is within one point (5 % of the loss) "
        "of plain Keras' final value, and whether the target holds (defaults 1 point, rules 2 points)."
        + (" Time ratio: elephant's `fit` wall time over plain Keras' `fit`, both evaluating the test set after "
           "every epoch, same cores, same run, Python workers already started." if engine == "spark" else "")
        + " Last column: the gap to plain Keras' mean over shuffle orders from the same weights, where measured "
          "(`--plain-orders`; below).",
        "",
        "| workload | configuration | workers | final | spread | plain Keras | gap | epochs to reach | "
        + ("time ratio | " if engine == "spark" else "") + "target | gap, plain over orders |",
        "|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if engine == "spark" else "") + "---|---:|",
    ]
    for (workload, config, workers), s in sorted(summary.items()):
        reach = "never" if s["reach"] is None else f"{s['reach']:.1f}"
        ratio = (f"{s['ratio']:.2f} | " if s["ratio"] is not None else "– | ") if engine == "spark" else ""
        lines.append(
            f"| {workload} | {config} | {workers} | {s['final']:.4f} | {s['spread']:.4f} | {s['plain']:.4f} | "
            f"{s['gap']:+.1f} | {reach} | {ratio}{'met' if s['meets'] else '**missed**'} | "
            f"{'–' if s['gap_orders'] is None else format(s['gap_orders'], '+.1f')} |"
        )
    return "\n".join(lines)


def compare(sim_rows: list[dict], spark_rows: list[dict], spark: dict) -> str:
    """Spark's summary against the simulator's on exactly the seeds Spark ran."""
    seeds = {(r["workload"], r["config"], r["workers"], r["seed"]) for r in spark_rows if "final" in r}
    sim = summarise([r for r in sim_rows if r["config"] == "plain" or (r["workload"], r["config"], r["workers"],
                                                                          r["seed"]) in seeds])
    lines = [
        "### simulator vs Spark",
        "",
        "Same workload, configuration, workers and seeds; the difference of the mean final metric "
        "(accuracy points; percent of the loss for the regression).",
        "",
        "| workload | configuration | workers | Spark | simulator | difference | within 2 points |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for key in sorted(set(sim) & set(spark)):
        a, b = spark[key], sim[key]
        diff = gap(key[0], b["final"], a["final"])
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {a['final']:.4f} | {b['final']:.4f} | {diff:+.1f} | "
                     f"{'yes' if abs(diff) <= (2.0 if _higher_is_better(key[0]) else 10.0) else '**no**'} |")
    return "\n".join(lines)


def order_spread(rows: list[dict]) -> str:
    """Plain Keras from each seed's weights in other shuffle orders (``convergence.py --plain-orders``): how far
    plain Keras' own final metric moves, the yardstick a gap of a few seeds is read against."""
    found = _plain_fits(rows)
    if not found:
        return ""
    lines = [
        "### plain Keras across shuffle orders",
        "",
        "Plain `model.fit` from each seed's initial weights: the run the gaps above are taken against, then the same "
        "weights with other shuffle orders. Standard deviation of the final metric over all of them (accuracy "
        "points, or percent of the mean loss); the gap of one seed against one plain fit carries about √2 times "
        "it, and the mean gap over n seeds about √(2/n) times.",
        "",
        "| workload | seed | plain Keras (the gaps' reference) | other orders | std |",
        "|---|---:|---:|---|---:|",
    ]
    for (workload, seed), finals in found.items():
        std = finals.std(ddof=1) * 100.0 / (1.0 if _higher_is_better(workload) else finals.mean())
        lines.append(f"| {workload} | {seed} | {finals[0]:.4f} | {', '.join(f'{v:.4f}' for v in finals[1:])} | "
                     f"{std:.2f} |")
    return "\n".join(lines)


def plots(summary: dict, engine: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    workloads = sorted({k[0] for k in summary})
    for workload in workloads:
        keys = [k for k in summary if k[0] == workload]
        workers = sorted({k[2] for k in keys})
        fig, axes = plt.subplots(1, len(workers), figsize=(5.2 * len(workers), 4.2), squeeze=False, sharey=True)
        for ax, k in zip(axes[0], workers):
            mine = sorted(c for c in keys if c[2] == k)
            plain = summary[mine[0]]["plain_curve"]
            ax.plot(range(1, len(plain) + 1), plain, color="black", linewidth=2.5, label="plain Keras")
            colors = plt.cm.tab20(np.linspace(0, 1, 20))  # more configurations than the default cycle's 10 colours
            for i, key in enumerate(mine):
                s = summary[key]
                style = "-" if key[1] in DEFAULTS else ":"
                ax.plot(range(1, len(s["curve"]) + 1), s["curve"], style, linewidth=1.4 if style == "-" else 1.1,
                        color=colors[i % 20], label=f"{key[1]} ({s['gap']:+.1f})")
            ax.set_title(f"{workload}, {k} workers ({engine})")
            ax.set_xlabel("epoch")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6.5, loc="lower right" if _higher_is_better(workload) else "upper right")
        axes[0][0].set_ylabel("test accuracy" if _higher_is_better(workload) else "test MSE")
        fig.tight_layout()
        path = os.path.join(RESULTS, f"convergence_{engine}_{workload}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def write() -> None:
    sections, summaries, loaded = [], {}, {}
    for engine in ("sim", "spark"):
        loaded[engine] = _load(engine)
    # plain Keras is the same fit under either engine: its other shuffle orders serve both
    orders = {(r["workload"], r["seed"]): r for rows in loaded.values() for r in rows if r["config"] == "plain-orders"}
    for engine in ("sim", "spark"):
        rows = loaded[engine]
        if not rows:
            continue
        known = {id(r) for r in rows}
        rows += [r for r in orders.values() if id(r) not in known]
        summaries[engine] = summarise(rows)
        sections.append(table(summaries[engine], engine))
        spread = order_spread(rows)
        if spread and len(summaries) == 1:  # once, against the first engine's plain fits
            sections.append(spread)
        plots(summaries[engine], engine)
    if "sim" in summaries and "spark" in summaries:
        sections.append(compare(loaded["sim"], loaded["spark"], summaries["spark"]))
    with open(os.path.join(RESULTS, "convergence.md"), "w") as f:
        f.write("# Convergence benchmark results\n\nWritten by `benchmarks/report_convergence.py`.\n\n")
        f.write("\n\n".join(sections) + "\n")
    print("\n\n".join(sections))


if __name__ == "__main__":
    write()
