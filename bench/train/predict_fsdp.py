"""A fully sharded (FSDP) training step predicted from a compute profile and the cost model of
the all-gather and the reduce-scatter, not restated from the run it predicts.

The schedule (PyTorch's FSDP2, ``fully_shard`` on each of K units, then the root): unit k's
parameters are all-gathered before its forward F_k; after its backward B_k (the backward runs
the units K-1, ..., 0) its gradients are reduce-scattered; with reshard-after-forward on the
forward freed them, so the backward all-gathers unit k again before B_k. a_k: the all-gather of
unit k's whole bytes, r_k its reduce-scatter (the cost model's ``time(name, nbytes)``).

Synchronous (nothing overlaps: every collective stalls the compute):
exposed = sum_k a_k (forward) + sum_k a_k (backward, reshard-after-forward on) + sum_k r_k.

Overlapped (FSDP's prefetch schedule): one collective at a time on the wire, in the order they
are issued; the all-gather of unit k+1 is issued when unit k's forward begins and that of unit
k-1 when unit k's backward begins (prefetch), the reduce-scatter of unit k when its backward
ends. A unit waits for its all-gather: the wait is the all-gather's exposed time. An overlapped
reduce-scatter runs during the backward of unit k-1, and what ends after the last unit's backward
is exposed; one that is not overlapped (FSDP2 on CPU tensors issues the reduce-scatter without
``async_op`` and reads its output at once) stalls the backward for its whole time. One unit
gains nothing (a + r, plus a again with reshard on); with compute to hide behind, only the first
all-gather of each pass and the last reduce-scatter are exposed; where communication dominates
the step is the wire's time plus the last unit's forward.

Where a rank has no core to spare (:mod:`bench.train.predict`), the part ``taken`` of an
overlapped collective's time that is processor work stalls the compute when it is issued; the
rest overlaps. The step is T_c + exposed, T_c the sum of the profile.
"""

from dataclasses import dataclass, field

from ..formats import stats
from .predict import CostModel, against_measured, processor_share

#: the exposed communication's parts, in the order of the step
PARTS = ("all_gather_forward", "all_gather_backward", "reduce_scatter")
COLLECTIVES = ("all_gather", "reduce_scatter")


@dataclass(frozen=True)
class Profile:
    """What a step computes, per unit in forward order: ``forward_s`` (F_k), ``backward_s``
    (B_k), ``nbytes`` (the unit's whole parameter bytes, what its all-gather delivers and its
    reduce-scatter reduces), and ``tail_s``: the step after the last unit's backward (the
    optimizer)."""

    forward_s: tuple
    backward_s: tuple
    nbytes: tuple
    tail_s: float = 0.0

    @property
    def compute_s(self):
        return sum(self.forward_s) + sum(self.backward_s) + self.tail_s

    @classmethod
    def of_units(cls, units, tail_ms):
        """From ``bench train``'s unit rows ("bytes", "forward_ms", "backward_ms") and tail in ms."""
        return cls(tuple(u["forward_ms"] / 1e3 for u in units), tuple(u["backward_ms"] / 1e3 for u in units),
                   tuple(u["bytes"] for u in units), tail_ms / 1e3)


@dataclass
class Prediction:
    """The exposed seconds of each part (:data:`PARTS`), every collective's (kind, unit, start,
    end) seconds after the step began, and the step."""

    exposed: dict = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    spans: list = field(default_factory=list)
    step_s: float = 0.0

    @property
    def exposed_s(self):
        return sum(self.exposed.values())


class _Timeline:
    """The compute's clock and the wire's: collectives issued at the compute's clock, one at a
    time on the wire; what the compute waits for is exposed, counted to ``part``."""

    def __init__(self, taken):
        self.clock, self.free, self.taken, self.made = 0.0, 0.0, taken, Prediction()

    def issue(self, kind, unit, seconds, overlapped, part):
        """The collective's end; a synchronous one (or an overlapped one's processor work,
        ``taken``) stalls the compute, counted to ``part``."""
        stall = seconds if not overlapped else self.taken * seconds
        if not overlapped:
            start = max(self.clock, self.free)
            end = self.free = start + seconds
            self.wait(end, part)
        else:
            self.clock += stall
            self.made.exposed[part] += stall
            start = max(self.clock, self.free)
            end = self.free = start + seconds - stall
        self.made.spans.append((kind, unit, start, end))
        return end

    def wait(self, end, part):
        self.made.exposed[part] += max(end - self.clock, 0.0)
        self.clock = max(self.clock, end)


def predict(profile, all_gather_s, reduce_scatter_s, reshard=True, overlap_all_gather=False,
            overlap_reduce_scatter=False, taken=0.0):
    """The :class:`Prediction` of a step of ``profile`` whose unit of b bytes takes
    ``all_gather_s(b)`` and ``reduce_scatter_s(b)``; ``reshard``: all-gathered again in the
    backward; ``overlap_*``: issued ahead (module docstring), else synchronous; ``taken``: the
    part of an overlapped collective that is processor work on shared cores."""
    line = _Timeline(taken)
    units = len(profile.forward_s)
    gather = [all_gather_s(b) for b in profile.nbytes]
    scatter = [reduce_scatter_s(b) for b in profile.nbytes]
    ends = {}

    def gathered(k, part):  # unit k's all-gather, issued now
        ends[k] = line.issue("all_gather", k, gather[k], overlap_all_gather, part)

    for k in range(units):
        if k == 0 or not overlap_all_gather:
            gathered(k, PARTS[0])
        line.wait(ends[k], PARTS[0])
        if overlap_all_gather and k + 1 < units:
            gathered(k + 1, PARTS[0])
        line.clock += profile.forward_s[k]
    last = line.clock
    for k in reversed(range(units)):
        if reshard:
            if k == units - 1 or not overlap_all_gather:
                gathered(k, PARTS[1])
            line.wait(ends[k], PARTS[1])
            if overlap_all_gather and k > 0:
                gathered(k - 1, PARTS[1])
        line.clock += profile.backward_s[k]
        last = line.issue("reduce_scatter", k, scatter[k], overlap_reduce_scatter, PARTS[2])
    line.wait(last, PARTS[2])  # the optimizer needs every gradient shard
    line.clock += profile.tail_s
    line.made.step_s = line.clock
    return line.made


class Predictor(CostModel):
    """``bench train``'s FSDP predictions: each run's step from the compute profile its reference
    run measured in the same round and each unit's all-gather and reduce-scatter from the
    :class:`.predict.CostModel` of both."""

    def __init__(self, matrix, pick, shared):
        super().__init__(matrix, pick, shared, COLLECTIVES)

    def rounds(self, spec, profiles, overlapped=None):
        """A :class:`Prediction` per round's :class:`Profile` for ``spec`` (algorithm, dtype,
        reshard, prefetch: its all-gathers overlapped unless ``overlapped`` says otherwise;
        reduce-scatters never, module docstring), or None."""
        gather, scatter = (self.seconds(c, spec.algorithm, spec.dtype) for c in COLLECTIVES)
        if gather is None or scatter is None:
            return None
        overlapped = spec.prefetch if overlapped is None else overlapped
        taken = processor_share(self.single_node, polls=spec.algorithm != "gloo") if self.shared else 0.0
        return [predict(p, gather, scatter, spec.reshard, overlapped, False, taken) for p in profiles]


def prediction_fields(predictions, synchronous, overlapped, exposed):
    """A run's prediction for -J beside its measured exposed ms a round: "predicted_exposed_ms"
    and "predicted_step_ms" (medians, with "predicted_exposed" and "predicted_step" their
    intervals), "predicted_parts_ms" (each of :data:`PARTS`, the median), the synchronous and
    overlapped schedules' exposed ms ("predicted_synchronous_ms", "predicted_overlapped_ms"),
    "predicted_collectives" (the last round's spans in ms), "prediction_error" (predicted /
    measured - 1, medians) and "prediction_within" (the predicted median in the measured
    interval); None where nothing is predicted."""
    made = dict.fromkeys(("predicted_exposed_ms", "predicted_exposed", "predicted_step_ms", "predicted_step",
                          "predicted_parts_ms", "predicted_synchronous_ms", "predicted_overlapped_ms",
                          "predicted_collectives", "prediction_error", "prediction_within"))
    if not predictions or any(p.exposed_s != p.exposed_s for p in predictions):  # none, or NaN: no schedule
        return made
    against_measured(made, predictions, exposed)
    made["predicted_parts_ms"] = {part: stats.median([p.exposed[part] * 1e3 for p in predictions]) for part in PARTS}
    for name, bound in (("synchronous", synchronous), ("overlapped", overlapped)):
        made[f"predicted_{name}_ms"] = stats.median([p.exposed_s * 1e3 for p in bound]) if bound else None
    made["predicted_collectives"] = [{"kind": kind, "unit": unit, "start_ms": a * 1e3, "end_ms": b * 1e3}
                                     for kind, unit, a, b in predictions[-1].spans]
    return made
