"""``python -m bench train --plot FILE.png``: step time against DDP's bucket cap (log x), one colour
per all-reduce: measured (solid, markers, the bars its 95% interval over the rounds) beside the
prediction from the noop run's compute profile and the cost model (dashed, same colour; none
where the model has no schedule), and the compute time (each bucket cap's noop run) as a dotted
black line. One panel per dtype (see :mod:`bench.tools.step_model`)."""

from plumbing.files import save_figure_atomically

from ..formats.tables import significant


def curves(runs):
    """{dtype: {label: [(bucket MiB, measured ms, predicted ms or None, the measured interval's low and high ms)]}}
    sorted by bucket, noop apart as {dtype: [(bucket MiB, compute ms)]}."""
    series, compute = {}, {}
    for run in runs:
        if run["algorithm"] == "noop":
            compute.setdefault(run["dtype"], []).append((run["bucket_mb"], run["compute_ms"]))
            continue
        label = run["algorithm"] + (" (overlap)" if run["overlap"] and run["algorithm"] != "gloo" else "")
        series.setdefault(run["dtype"], {}).setdefault(label, []).append(
            (run["bucket_mb"], run["step_ms"], run.get("predicted_step_ms"), run["step"]["ci_low"],
             run["step"]["ci_high"]))
    return {d: {k: sorted(v) for k, v in s.items()} for d, s in series.items()}, {d: sorted(v) for d, v in compute.items()}


def plot(document, output):
    """Write the PNG of a ``bench train -J`` document's runs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    series, compute = curves(document["runs"])
    dtypes = list(dict.fromkeys([*compute, *series]))
    fig, axes = plt.subplots(1, len(dtypes), figsize=(7.5 * len(dtypes) + 2.5, 5.5), dpi=120, squeeze=False)
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels = list(dict.fromkeys(label for per in series.values() for label in per))
    for ax, dtype in zip(axes[0], dtypes):
        for label, points in series.get(dtype, {}).items():
            colour = palette[labels.index(label) % len(palette)]
            buckets = [p[0] for p in points]
            below, above = [p[1] - p[3] for p in points], [p[4] - p[1] for p in points]
            ax.errorbar(buckets, [p[1] for p in points], yerr=[below, above], marker="o", color=colour, capsize=3,
                        label=f"{label}, measured [95% interval]")
            predicted = [(p[0], p[2]) for p in points if p[2] is not None]
            if predicted:
                ax.plot([p[0] for p in predicted], [p[1] for p in predicted], linestyle="--", marker="x", color=colour,
                        alpha=0.8, label=f"{label}, predicted")
        if dtype in compute:  # each bucket cap's noop run; one alone spans the axis
            points = compute[dtype]
            if len(points) == 1:
                ax.axhline(points[0][1], color="black", linewidth=1, linestyle=":", label="compute only (noop)")
            else:
                ax.plot([p[0] for p in points], [p[1] for p in points], color="black", linewidth=1, linestyle=":",
                        marker=".", label="compute only (noop)")
            ax.annotate(f"compute only (noop): {significant(points[0][1])} ms", (points[0][0], points[0][1]),
                        xytext=(0, -12), textcoords="offset points", fontsize="small")
        ax.set_xscale("log")
        measured = sorted({p[0] for points in series.get(dtype, {}).values() for p in points})
        if measured:
            ax.set_xlim(measured[0] / 1.5, measured[-1] * 1.5)
            ax.xaxis.set_major_locator(FixedLocator(measured))  # a tick at each bucket cap that ran
            ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("DDP bucket cap (MiB, log scale)")
        ax.set_ylabel("step time (ms)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{dtype} parameters and gradients")
        ax.grid(True, which="both", alpha=0.3)
    model = document["model"]
    fig.suptitle(f"DDP step time, {document['ranks']} ranks: {model['description']}, "
                 f"{model['parameters']:,} parameters, batch {model['batch']} a rank")
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0, fontsize="small")
    fig.tight_layout()
    save_figure_atomically(fig, output)
    plt.close(fig)
