"""``python -m bench train --strategy fsdp --plot FILE.png``: the FSDP runs' steps, drawn beside
``FILE.png`` as ``FILE-fsdp.png`` (:func:`fsdp_path`).

One panel per dtype and reshard choice, two bars per run: measured (the reference's compute, then
the exposed forward all-gathers, backward all-gathers and reduce-scatters stacked on it, each the
median over the rounds, a part whose median is below 0, noise, drawn as 0) with the step's median
and 95% interval as a black marker; and predicted (the same compute, the step model's parts:
:mod:`bench.tools.step_model_fsdp`), hatched. The reference (collectives that move nothing) is the
compute alone."""

import os

from plumbing.files import save_figure_atomically

from .step_model_fsdp import PARTS

#: the stacked parts and their colours: compute, then each exposed part
SEGMENTS = (("compute", "compute (reference)", "#999999"), (PARTS[0], "all-gathers, forward", "#1f77b4"),
            (PARTS[1], "all-gathers, backward", "#ff7f0e"), (PARTS[2], "reduce-scatters", "#2ca02c"))


def fsdp_path(path):
    """Where the FSDP picture of ``--plot path`` goes: ``<stem>-fsdp<ext>``."""
    stem, ext = os.path.splitext(path)
    return f"{stem}-fsdp{ext or '.png'}"


def label(run):
    return run["algorithm"] + ("+ovl" if run["overlap"] and run["algorithm"] != "gloo" else "")


def bars(run):
    """([measured ms of each segment], [predicted ms of each segment] or None) of one run."""
    measured = [run["compute_ms"], run["exposed_all_gather_ms"]["forward"], run["exposed_all_gather_ms"]["backward"],
                run["exposed_reduce_scatter_ms"]]
    parts = run.get("predicted_parts_ms")
    predicted = None if not parts else [run["compute_ms"], *(parts[p] for p in PARTS)]
    return [max(0.0, v) for v in measured], predicted


def plot(document, output):
    """Write the PNG of a ``bench train -J`` document's FSDP runs (``fsdp_runs``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = document["fsdp_runs"]
    panels = list(dict.fromkeys((r["dtype"], r["reshard_after_forward"]) for r in runs))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels) + 2.5, 5.5), dpi=120, squeeze=False)
    for ax, (dtype, reshard) in zip(axes[0], panels):
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
        ax.set_xticks(range(len(mine)), [label(r) for r in mine], fontsize="small")
        ax.set_xlabel("each run: measured (left), predicted (right, hatched)")
        ax.set_ylabel("step time (ms)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{dtype}, reshard after forward {'on' if reshard else 'off'}")
        ax.grid(True, axis="y", alpha=0.3)
    model = document["model"]
    fig.suptitle(f"FSDP2 step, {document['ranks']} ranks: {model['description']}, {model['parameters']:,} parameters, "
                 f"batch {model['batch']} a rank;\nexposed communication stacked on the reference's compute "
                 "(a part below 0, noise, drawn as 0)")
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0, fontsize="small")
    fig.tight_layout()
    save_figure_atomically(fig, output)
    plt.close(fig)
