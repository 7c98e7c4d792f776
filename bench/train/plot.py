"""``python -m bench train --plot FILE.png``: the pictures of a ``bench train -J`` document, one
per strategy, the same frame around each (:func:`_panels`, :func:`_save`).

DDP (``FILE.png``, :func:`plot`): step time against DDP's bucket cap (log x), one colour per
all-reduce: measured (solid, markers, the bars its 95% interval over the rounds) beside the
prediction from the noop run's compute profile and the cost model (dashed, same colour; none
where the model has no schedule), and the compute time (each bucket cap's noop run) as a dotted
black line. One panel per dtype (see :mod:`bench.train.predict`).

FSDP (``FILE-fsdp.png``, :func:`fsdp_path`, :func:`fsdp_plot`): one panel per dtype and reshard
choice, two bars per run: measured (the reference's compute, then the exposed forward
all-gathers, backward all-gathers and reduce-scatters stacked on it, each the median over the
rounds, a part whose median is below 0, noise, drawn as 0) with the step's median and 95%
interval as a black marker; and predicted (the same compute, the step model's parts:
:mod:`bench.train.predict_fsdp`), hatched. The reference (collectives that move nothing) is the
compute alone."""

import os

from plumbing.files import save_figure_atomically

from ..formats.tables import significant
from .figures import run_label
from .predict_fsdp import PARTS

#: the FSDP picture's stacked parts and their colours: compute, then each exposed part
SEGMENTS = (("compute", "compute (reference)", "#999999"), (PARTS[0], "all-gathers, forward", "#1f77b4"),
            (PARTS[1], "all-gathers, backward", "#ff7f0e"), (PARTS[2], "reduce-scatters", "#2ca02c"))


def _panels(count, width):
    """matplotlib's pyplot, a figure of ``count`` panels of ``width`` inches side by side and their axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, count, figsize=(width * count + 2.5, 5.5), dpi=120, squeeze=False)
    return plt, fig, axes[0]


def _save(plt, fig, axes, title, output):
    """Each panel's step-time axis from 0, the title, the legend beside the last panel; written atomically."""
    for ax in axes:
        ax.set_ylabel("step time (ms)")
        ax.set_ylim(bottom=0)
    fig.suptitle(title)
    axes[-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0, fontsize="small")
    fig.tight_layout()
    save_figure_atomically(fig, output)
    plt.close(fig)


def _model_text(document):
    model = document["model"]
    return (f"{document['ranks']} ranks: {model['description']}, {model['parameters']:,} parameters, "
            f"batch {model['batch']} a rank")


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
    series, compute = curves(document["runs"])
    dtypes = list(dict.fromkeys([*compute, *series]))
    plt, fig, axes = _panels(len(dtypes), 7.5)
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    labels = list(dict.fromkeys(label for per in series.values() for label in per))
    for ax, dtype in zip(axes, dtypes):
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
        ax.set_title(f"{dtype} parameters and gradients")
        ax.grid(True, which="both", alpha=0.3)
    _save(plt, fig, axes, f"DDP step time, {_model_text(document)}", output)


def fsdp_path(path):
    """Where the FSDP picture of ``--plot path`` goes: ``<stem>-fsdp<ext>``."""
    stem, ext = os.path.splitext(path)
    return f"{stem}-fsdp{ext or '.png'}"


def bars(run):
    """([measured ms of each segment], [predicted ms of each segment] or None) of one run."""
    measured = [run["compute_ms"], run["exposed_all_gather_ms"]["forward"], run["exposed_all_gather_ms"]["backward"],
                run["exposed_reduce_scatter_ms"]]
    parts = run.get("predicted_parts_ms")
    predicted = None if not parts else [run["compute_ms"], *(parts[p] for p in PARTS)]
    return [max(0.0, v) for v in measured], predicted


def fsdp_plot(document, output):
    """Write the PNG of a ``bench train -J`` document's FSDP runs (``fsdp_runs``)."""
    runs = document["fsdp_runs"]
    panels = list(dict.fromkeys((r["dtype"], r["reshard_after_forward"]) for r in runs))
    plt, fig, axes = _panels(len(panels), 6.5)
    for ax, (dtype, reshard) in zip(axes, panels):
        mine = [r for r in runs if (r["dtype"], r["reshard_after_forward"]) == (dtype, reshard)]
        for i, run in enumerate(mine):
            measured, predicted = bars(run)
            for x, values, hatch in ((i - 0.2, measured, None), (i + 0.2, predicted, "//")):
                if values is None:
                    continue
                bottom = 0.0
                for (_, name, colour), value in zip(SEGMENTS, values):
                    ax.bar(x, value, 0.38, bottom=bottom, color=colour, hatch=hatch, edgecolor="white",
                           label=name if (i, hatch) == (0, None) else None)
                    bottom += value
            step = run["step"]
            ax.errorbar(i - 0.2, run["step_ms"], yerr=[[run["step_ms"] - step["ci_low"]], [step["ci_high"] - run["step_ms"]]],
                        color="black", marker="_", markersize=14, capsize=4,
                        label="measured step [95% interval]" if i == 0 else None)
        ax.bar(0, 0, 0, color="white", edgecolor="grey", hatch="//", label="predicted (hatched)")
        ax.set_xticks(range(len(mine)), [run_label(r) for r in mine], fontsize="small")
        ax.set_xlabel("each run: measured (left), predicted (right, hatched)")
        ax.set_title(f"{dtype}, reshard after forward {'on' if reshard else 'off'}")
        ax.grid(True, axis="y", alpha=0.3)
    _save(plt, fig, axes, f"FSDP2 step, {_model_text(document)};\nexposed communication stacked on the reference's "
          "compute (a part below 0, noise, drawn as 0)", output)
