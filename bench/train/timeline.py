"""``python -m bench train --timeline FILE.png``: what overlapped, per run, measured beside
predicted: each bucket's all-reduce (start to end, milliseconds after the backward pass began)
and the backward pass, drawn as a picture and written as a Chrome trace (trace-event JSON,
``FILE.trace.json``, which Perfetto and chrome://tracing open).

The measured lane is the last timed step of the last round on rank 0 (a hook's records: when
DDP handed each bucket over, when its all-reduce started and ended); runs without a hook (gloo)
have none. The predicted lane is :mod:`bench.train.predict`'s, from the same round's noop
profile. The backward pass is the noop run's (the compute the all-reduces hide behind)."""

import os

from plumbing.files import save_figure_atomically, write_json_atomically


def lanes(document):
    """Per run with a timeline: (its label, the backward pass ms, [(ready, start, end) ms measured],
    [(start, end) ms predicted])."""
    made = []
    for run in document["runs"]:
        if run["algorithm"] == "noop":
            continue
        measured = [tuple(b["timeline_ms"][k] for k in ("ready", "start", "end")) for b in run["buckets"]
                    if b.get("timeline_ms")]
        predicted = [(b["start_ms"], b["end_ms"]) for b in run.get("predicted_buckets") or []]
        if measured or predicted:
            label = (f"{run['algorithm']}{'+ovl' if run['overlap'] and run['algorithm'] != 'gloo' else ''} "
                     f"{run['bucket_mb']:g} MiB {run['dtype']}")
            made.append((label, run["backward_ms"], measured, predicted))
    return made


def trace(document):
    """The Chrome trace of :func:`lanes`: a process per run, threads "backward", "measured" and
    "predicted", complete events ("ph": "X") in microseconds."""
    events = []
    for pid, (label, backward, measured, predicted) in enumerate(lanes(document)):
        events.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": label}})
        for tid, name in enumerate(("backward", "measured", "predicted")):
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
        events.append({"name": "backward pass", "ph": "X", "pid": pid, "tid": 0, "ts": 0.0, "dur": backward * 1e3})
        for k, (ready, start, end) in enumerate(measured):
            events.append({"name": f"bucket {k}", "ph": "X", "pid": pid, "tid": 1, "ts": start * 1e3,
                           "dur": (end - start) * 1e3, "args": {"ready_ms": ready}})
        for k, (start, end) in enumerate(predicted):
            events.append({"name": f"bucket {k}", "ph": "X", "pid": pid, "tid": 2, "ts": start * 1e3,
                           "dur": (end - start) * 1e3})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def trace_path(picture):
    """FILE.trace.json beside FILE.png."""
    return os.path.splitext(picture)[0] + ".trace.json"


def draw(document, output):
    """Write the picture to ``output`` and the trace beside it (:func:`trace_path`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = lanes(document)
    write_json_atomically(trace_path(output), trace(document))
    fig, ax = plt.subplots(figsize=(11, 1.0 + 0.55 * max(len(rows), 1)), dpi=120)
    for y, (label, backward, measured, predicted) in enumerate(reversed(rows)):
        ax.barh(y, backward, height=0.8, color="0.9", edgecolor="0.6")
        ax.broken_barh([(s, e - s) for _, s, e in measured], (y + 0.02, 0.36), facecolor="tab:blue",
                       edgecolor="white", linewidth=1)  # buckets that follow each other stay apart
        ax.broken_barh([(s, e - s) for s, e in predicted], (y - 0.38, 0.36), facecolor="none", edgecolor="tab:orange",
                       hatch="///")
        ax.plot([r for r, _, _ in measured], [y + 0.2] * len(measured), "k|", markersize=9)
    ax.set_yticks(range(len(rows)), [row[0] for row in reversed(rows)], fontsize="small")
    ax.set_xlabel("ms after the backward pass began")
    ax.set_xlim(left=0)
    handles = [plt.Rectangle((0, 0), 1, 1, color="0.9", ec="0.6"), plt.Rectangle((0, 0), 1, 1, color="tab:blue"),
               plt.Rectangle((0, 0), 1, 1, fc="none", ec="tab:orange", hatch="///"),
               plt.Line2D([], [], color="k", marker="|", linestyle="none", markersize=9)]
    ax.legend(handles, ["backward pass (noop run)", "all-reduce, measured (last step, rank 0)",
                        "all-reduce, predicted", "bucket handed over (measured)"],
              loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small", borderaxespad=0)
    ax.set_title(f"DDP buckets, {document['ranks']} ranks: {document['model']['description']}")
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    save_figure_atomically(fig, output)
    plt.close(fig)

