"""A data-parallel training step predicted from a compute profile and a network, not restated
from the run it predicts.

Inputs, neither timed in the run being predicted:

- a compute profile (:class:`Profile`): the step's compute time T_c, the backward pass's T_b
  and each bucket's bytes and ready time (seconds after the backward pass began), from a run
  whose buckets are not all-reduced (``bench train``'s noop run) or its ``-J`` file;
- each bucket's all-reduce time, from the cost model (:mod:`topology.model`, every
  algorithm's schedule) on the network: a probe's bandwidth matrix or a network file.

Synchronous (a hook that reduces a bucket before the backward pass goes on): every all-reduce
stalls the backward pass, exposed = sum_k t_k. Overlapped (DDP's own asynchronous all-reduce,
the hook's communication thread): bucket k starts at max(ready_k, end_(k-1)) and only what ends
after the backward pass is exposed, max(0, end_K - T_b) (:func:`exposed_after`).

Where a rank has no core to spare beside its compute threads (``bench train``'s cores shared), an
overlapped all-reduce's processor work comes out of the backward pass: the part ``f`` of its
time that is processor work is exposed as if synchronous, and the rest overlaps:
exposed = sum_k f t_k + exposed_after(ready, (1 - f) t_k, T_b). Over shared memory an
all-reduce is all copies and reductions, f = 1. Between nodes it depends on how it waits for
the wire (:func:`processor_share`): MPI's progress engine spins on a core while the bytes cross
(MPICH's default), so an all-reduce over MPI holds a core for its whole time, f = 1; gloo's
threads sleep in the kernel until their sockets are ready and copy bytes at memory speed while
they cross a far slower wire, f = 0.

The step is T_c + exposed; its efficiency E = T_c / (T_c + T_m), T_m the exposed
communication (Hoefler's "communication overhead"; the seed's E).
"""

from dataclasses import dataclass, field

from ..formats import stats


def exposed_after(ready, seconds, backward, blocking=False):
    """Communication time a step exposes when bucket k becomes ready ``ready[k]`` seconds into a
    backward pass of ``backward`` seconds and its all-reduce takes ``seconds[k]``.

    Asynchronous buckets (DDP's own all-reduce, an overlapping hook) go out one after another,
    bucket k at max(its ready time, the end of bucket k-1), while the backward pass goes on;
    only what ends after the backward pass is exposed. ``blocking`` buckets (a synchronous
    hook) stall the backward pass for their whole time: all of it is exposed. The step then
    takes the compute time plus this (efficiency E = T_c / (T_c + exposed))."""
    if blocking:
        return float(sum(seconds))
    spans = queued(ready, seconds)
    return max(spans[-1][1] - backward, 0.0) if spans else 0.0


def queued(ready, seconds):
    """(start, end) of each bucket's all-reduce when they go out one after another: bucket k at
    max(``ready[k]``, the end of bucket k-1), taking ``seconds[k]``."""
    spans, finish = [], 0.0
    for when, took in zip(ready, seconds):
        start = max(finish, when)
        finish = start + took
        spans.append((start, finish))
    return spans


@dataclass(frozen=True)
class Profile:
    """What a step computes: ``compute_s`` (T_c, the whole step without all-reduce),
    ``backward_s`` (T_b, when the last bucket became ready) and ``buckets``, (bytes, ready
    seconds after the backward pass began) in the order DDP hands them over."""

    compute_s: float
    backward_s: float
    buckets: tuple

    @classmethod
    def of_noop(cls, compute_ms, backward_ms, buckets):
        """From ``bench train``'s figures of a noop run: milliseconds, and rows with "bytes" and
        "ready_ms"."""
        return cls(compute_ms / 1e3, backward_ms / 1e3,
                   tuple((row["bytes"], row["ready_ms"] / 1e3) for row in buckets))


@dataclass
class Prediction:
    """Each bucket's all-reduce seconds and its (start, end) seconds after the backward pass
    began (synchronous: each stalls the pass; overlapped: one after another from its ready
    time, which on shared cores the processor work of those before it delays), the exposed
    communication, the step and its efficiency."""

    allreduce_s: list
    spans: list = field(default_factory=list)
    exposed_s: float = 0.0
    step_s: float = 0.0

    @property
    def efficiency(self):
        return (self.step_s - self.exposed_s) / self.step_s if self.step_s else None


def processor_share(single_node, polls=True):
    """The part of an all-reduce's time that is processor work: all of it where every rank
    shares one node's memory; across nodes, all of it for an all-reduce that ``polls`` while it
    waits (MPI's progress engine), none for one that sleeps in the kernel (gloo) (module
    docstring)."""
    return 1.0 if single_node or polls else 0.0


def predict(profile, allreduce_seconds, overlapped, shared=False, share=1.0):
    """The :class:`Prediction` of a step of ``profile`` whose bucket of b bytes takes
    ``allreduce_seconds(b)``; ``overlapped``: asynchronous all-reduces (else a synchronous
    hook); ``shared``: the cores are shared, where the ``share`` of an
    all-reduce that is processor work (:func:`processor_share`) comes out of the backward pass."""
    times = [allreduce_seconds(nbytes) for nbytes, _ in profile.buckets]
    ready = [when for _, when in profile.buckets]
    made = Prediction(times)
    if not overlapped:
        clock = 0.0
        for when, took in zip(ready, times):  # each stalls the backward pass where it is ready
            start = when + clock
            made.spans.append((start, start + took))
            clock += took
        made.exposed_s = sum(times)
    else:
        taken = share if shared else 0.0
        # one after another, each as long as it takes; the processor work of those before a bucket
        # delays its ready time as it stalls the backward pass (taken = 1: the synchronous spans)
        delayed = [when + taken * sum(times[:k]) for k, when in enumerate(ready)]
        made.spans = queued(delayed, times)
        made.exposed_s = sum(t * taken for t in times) + exposed_after(ready, [t * (1 - taken) for t in times],
                                                                       profile.backward_s)
    made.step_s = profile.compute_s + made.exposed_s
    return made


class CostModel:
    """The cost model of every algorithm's schedules of ``collectives`` on a
    :class:`topology.BandwidthMatrix` (a probe's), as both strategies' predictions ask it:
    ``pick(nbytes, dtype, collective)`` is what auto runs; ``shared``: the cores are shared. gloo
    is modelled as the ring and sleeps while it waits; ours poll (MPI); native MPI has no
    schedule and is not predicted."""

    def __init__(self, matrix, pick, shared, collectives=("allreduce",)):
        from algorithms.costs import cost_model

        self.models = {c: cost_model(matrix, collective=c) for c in collectives}
        self.pick, self.shared, self.single_node = pick, shared, matrix.node_count == 1

    def seconds(self, collective, algorithm, dtype):
        """``seconds(nbytes)`` of one ``collective`` of ``algorithm`` (0 for noop, which moves
        nothing), or None where the model has no schedule of it."""
        if algorithm == "noop":
            return lambda nbytes: 0.0
        name, model = "ring" if algorithm == "gloo" else algorithm, self.models[collective]
        if name != "auto" and name not in model.schedules:
            return None

        def seconds(nbytes):
            chosen = self.pick(nbytes, dtype, collective) if name == "auto" else name
            return model.time(chosen, nbytes) if chosen in model.schedules else float("nan")
        return seconds


class Predictor(CostModel):
    """``bench train``'s DDP predictions: each run's step from the compute profile its noop run
    measured in the same round and each bucket's all-reduce from the :class:`CostModel`."""

    def rounds(self, algorithm, dtype, overlapped, reference):
        """A :class:`Prediction` per round from that round's noop run (``reference``: the rounds
        as ``bench train`` keeps them, each with "steps_s", "backward_ms" and "buckets"), or None."""
        seconds = self.seconds("allreduce", algorithm, dtype)
        if seconds is None:
            return None
        made = []
        for one in reference:
            profile = Profile.of_noop(stats.median(one["steps_s"]) * 1e3, one["backward_ms"], one["buckets"])
            made.append(predict(profile, seconds, overlapped, self.shared,
                                processor_share(self.single_node, polls=algorithm != "gloo")))
        return made


def prediction_fields(predictor, spec, reference, exposed):
    """A ``bench train`` run's prediction by ``predictor`` (a :class:`Predictor`, or None) for the
    configuration ``spec``, from its noop run's rounds (``reference``), beside its measured
    exposed milliseconds a round (``exposed``): "predicted_exposed_ms",
    "predicted_step_ms" (medians over the rounds, "predicted_exposed" and "predicted_step" with
    their intervals), "predicted_efficiency", "predicted_buckets" (each bucket's all-reduce, start
    and end after the backward pass began, the last round's), "prediction_error" (predicted /
    measured - 1, the medians) and "prediction_within" (the predicted median in the measured
    interval); each None where nothing is predicted."""
    made = dict.fromkeys(("predicted_exposed_ms", "predicted_exposed", "predicted_step_ms", "predicted_step",
                          "predicted_efficiency", "predicted_buckets", "prediction_error", "prediction_within"))
    predictions = None if predictor is None else predictor.rounds(spec.algorithm, spec.dtype, spec.asynchronous,
                                                                  reference)
    if not predictions or any(p.exposed_s != p.exposed_s for p in predictions):  # none, or NaN: no schedule
        return made
    against_measured(made, predictions, exposed)
    made["predicted_efficiency"] = stats.median_interval([p.efficiency for p in predictions]).as_dict()
    last = predictions[-1]
    made["predicted_buckets"] = [{"allreduce_ms": t * 1e3, "start_ms": a * 1e3, "end_ms": b * 1e3}
                                 for t, (a, b) in zip(last.allreduce_s, last.spans)]
    return made


def against_measured(made, predictions, exposed):
    """Set in ``made`` the medians over the rounds of ``predictions`` (each with ``exposed_s`` and
    ``step_s``): "predicted_exposed_ms" and "predicted_step_ms", with their intervals as
    "predicted_exposed" and "predicted_step", and beside the measured exposed ms a round
    (``exposed``): "prediction_error" (predicted / measured - 1, the medians) and
    "prediction_within" (the predicted median in the measured interval)."""
    for name, values in (("exposed", [p.exposed_s * 1e3 for p in predictions]),
                         ("step", [p.step_s * 1e3 for p in predictions])):
        made[f"predicted_{name}_ms"] = stats.median(values)
        made[f"predicted_{name}"] = stats.median_interval(values).as_dict()
    measured = stats.median(exposed)
    made["prediction_error"] = made["predicted_exposed_ms"] / measured - 1 if measured > 0 else None
    made["prediction_within"] = stats.median_interval(exposed).holds(made["predicted_exposed_ms"])
