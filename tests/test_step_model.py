"""bench.train.predict and bench scaling --train's projection against closed forms on synthetic
compute profiles and networks."""

import numpy as np
import pytest

from algorithms.costs import cost_model
from bench.train.projection import compute_factor, network_for
from bench.train.predict import Profile, predict, processor_share
from topology import BandwidthMatrix
from topology.model import Network


def constant(seconds):
    return lambda nbytes: seconds


def test_one_bucket_ready_at_the_end_is_exposed_whole_either_way():
    profile = Profile(0.300, 0.200, ((16 << 20, 0.200),))
    for overlapped in (False, True):
        made = predict(profile, constant(0.050), overlapped)
        assert made.exposed_s == pytest.approx(0.050) and made.step_s == pytest.approx(0.350)
        assert made.efficiency == pytest.approx(0.300 / 0.350)
        assert made.spans == [pytest.approx((0.200, 0.250))]


def test_buckets_all_ready_at_the_end_expose_their_sum():
    profile = Profile(0.300, 0.200, tuple((1 << 20, 0.200) for _ in range(4)))
    sync, overlapped = (predict(profile, constant(0.010), o) for o in (False, True))
    assert sync.exposed_s == pytest.approx(0.040) == overlapped.exposed_s
    assert [end for _, end in overlapped.spans] == pytest.approx([0.210, 0.220, 0.230, 0.240])


def test_buckets_that_end_before_the_backward_pass_are_hidden():
    """Four buckets ready at 20, 40, 60 and 80 ms of a 100 ms backward pass, 10 ms each: nothing
    exposed when overlapped, E = 1; all 40 ms when synchronous, each stalling the pass."""
    profile = Profile(0.150, 0.100, ((1 << 20, 0.020), (1 << 20, 0.040), (1 << 20, 0.060), (1 << 20, 0.080)))
    overlapped = predict(profile, constant(0.010), True)
    assert overlapped.exposed_s == 0 and overlapped.efficiency == 1
    sync = predict(profile, constant(0.010), False)
    assert sync.exposed_s == pytest.approx(0.040) and sync.step_s == pytest.approx(0.190)
    assert sync.spans == [pytest.approx(s) for s in ((0.020, 0.030), (0.050, 0.060), (0.080, 0.090), (0.110, 0.120))]


def test_a_queue_of_buckets_exposes_what_ends_after_the_pass():
    """Three 30 ms buckets ready at 10, 20 and 90 ms of a 100 ms pass: they run 10-40, 40-70 and
    90-120 ms: 20 ms exposed."""
    profile = Profile(0.200, 0.100, ((1, 0.010), (1, 0.020), (1, 0.090)))
    made = predict(profile, constant(0.030), True)
    assert made.spans == [pytest.approx(s) for s in ((0.010, 0.040), (0.040, 0.070), (0.090, 0.120))]
    assert made.exposed_s == pytest.approx(0.020)


def test_on_shared_cores_the_processor_work_is_exposed():
    """On one node (every byte copied and reduced by the processor) with no core to spare, the
    overlapped all-reduce takes its time out of the backward pass: the synchronous exposure.
    Across nodes an all-reduce that polls while it waits (MPI) does the same; one that sleeps in
    the kernel (gloo) hides behind the pass; with a core to spare everything overlapped hides."""
    profile = Profile(0.150, 0.100, ((1 << 20, 0.020), (1 << 20, 0.040)))
    for single_node, polls, exposed in ((True, True, 0.020), (True, False, 0.020), (False, True, 0.020),
                                        (False, False, 0.0)):
        share = processor_share(single_node, polls)
        made = predict(profile, constant(0.010), True, shared=True, share=share)
        assert made.exposed_s == pytest.approx(exposed), (single_node, polls)
        if share == 1:  # the synchronous spans: each bucket stalls the pass
            assert made.spans == [pytest.approx(s) for s in ((0.020, 0.030), (0.050, 0.060))]
        else:
            assert made.spans == [pytest.approx(s) for s in ((0.020, 0.030), (0.040, 0.050))]
        assert predict(profile, constant(0.010), True, shared=False, share=share).exposed_s == 0


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_a_nic_bound_network_gives_the_rings_closed_form(ranks):
    """One rank a node behind 1 GB/s NICs and 10 us links: the ring's bucket of M bytes takes
    2(N-1)/N M/beta + 2(N-1) alpha, and a 64 MiB bucket ready at the end of a 100 ms pass is
    all exposed."""
    model = cost_model(Network.uniform(ranks, 1.0, 10.0))
    nbytes = 64 << 20
    closed = 2 * (ranks - 1) / ranks * nbytes / 1e9 + 2 * (ranks - 1) * 10e-6
    assert model.time("ring", nbytes) == pytest.approx(closed, rel=1e-6)
    made = predict(Profile(0.300, 0.100, ((nbytes, 0.100),)), lambda b: model.time("ring", b), True)
    assert made.exposed_s == pytest.approx(closed, rel=1e-6)


def test_a_probe_of_one_node_extended_by_nodes_gives_the_rings_closed_form():
    """A 2-rank node (10 GB/s, 1 us within) extended to 8 ranks on 4 nodes joined at 1 GB/s and
    10 us: the ring crosses a node boundary in every step, one flow through each port, so a
    bucket of M bytes takes 2(N-1)/N M/beta + 2(N-1) alpha; the first 3 ranks of a racked
    network keep their racks and uplinks; 4 ranks of threads on 2 cores compute 2x the 2 ranks'."""
    node = BandwidthMatrix([[0, 10.0], [10.0, 0]], [[0, 1.0], [1.0, 0]], nodes=[0, 0])
    network = network_for(8, node, 1.0, 10.0, 1, None)
    assert network.n == 8 and network.node_count == 4
    nbytes = 64 << 20
    closed = 2 * 7 / 8 * nbytes / 1e9 + 2 * 7 * 10e-6
    assert cost_model(network).time("ring", nbytes) == pytest.approx(closed, rel=1e-6)
    with pytest.raises(ValueError, match="not a multiple"):
        network_for(7, node, 1.0, 10.0, 1, None)
    racked = BandwidthMatrix(np.full((4, 4), 1.0) - np.eye(4), nodes=[0, 1, 2, 3], racks=[0, 0, 1, 1],
                             uplinks={"up": [0.5, 0.25], "down": [0.5, 0.25]})
    three = network_for(3, racked, 1.0, 10.0, 1, None)
    assert three.racks.tolist() == [0, 0, 1] and three.up.tolist() == [0.5e9, 0.25e9]
    with pytest.raises(ValueError, match="only a probe of one node"):
        network_for(8, racked, 1.0, 10.0, 1, None)
    assert compute_factor(4, 2, 1, 2) == 2 and compute_factor(8, 2, 1, 2) == 4 and compute_factor(8, 2, 1, None) == 1
    assert compute_factor(2, 1, 1, 2) == 1  # both fit the cores
