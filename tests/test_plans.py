"""Plans (algorithms/runtime/plan.py) checked without MPI: each algorithm written as a plan, run
symbolically at 1-9 ranks on even, uneven and segmented counts, in and out of place, sums
every rank's input into every output element exactly once without writing a slice in flight or
counting on buffering (tests/plan_check.py); the replay prices plans at the α-β closed forms
and as the cost model's schedules do; the JSON document reads back as it was written; and
``python -m bench plan`` prints and exports them."""

import importlib
import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from algorithms.runtime import plan
from algorithms.runtime.layout import SEGMENT_BYTES
from algorithms.costs import cost_model
from algorithms.registry import REGISTERED
from bench.tools.plan import PLANNED
from topology import BandwidthMatrix
from topology.model import Network
from topology.model.replay import replay

from conftest import run_mpi
from plan_check import PlanError, run_symbolically

RANKS = range(1, 10)


def plan_of(name, n, count, itemsize, nodes=None):
    """Every rank's steps of ``name``'s plan; its tree or ring order from uneven links, hier's nodes
    ``nodes`` (default: consecutive pairs of ranks)."""
    record = REGISTERED[name]
    extra = ()
    if record.plan_input is not None:
        matrix = BandwidthMatrix(uneven_links(n), np.ones((n, n)))
        extra = (record.plan_input(n, matrix, [r // 2 for r in range(n)] if nodes is None else nodes),)
    return [record.steps(n, r, count, itemsize, *extra) for r in range(n)]


def uneven_links(n):
    """Links whose speeds differ pair by pair, so that the matched trees are not the binomial one."""
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    bandwidth = 1.0 + ((i * 7 + j * 3) % 5) + ((j * 7 + i * 3) % 5)
    np.fill_diagonal(bandwidth, 0.0)
    return bandwidth


def test_these_are_plans():
    assert {"ps", "ring", "bamring", "dring", "tree", "bamtree", "kmtree", "dbtree", "rd", "rabenseifner", "hier"} <= set(PLANNED)


@pytest.mark.parametrize("name", PLANNED)
@pytest.mark.parametrize("n", RANKS)
def test_plan_sums_every_input_once(name, n):
    """Every small count at every rank count; a vector of three segments at 2, 5 and 8 ranks."""
    segmented = (2 * SEGMENT_BYTES // 4 + 3,) if n in (2, 5, 8) else ()
    network = Network.uniform(n, 10.0, 5.0)
    for count in (0, 1, n - 1, n, n + 1, 37, *segmented):
        ranks = plan_of(name, n, count, 4)
        for in_place in (False, True):
            run_symbolically(ranks, count, in_place)
        replay(ranks, 4, network)  # ends, though no send completes before its receive is posted


@pytest.mark.parametrize("name", PLANNED)
def test_plan_cuts_segments_by_item_size(name):
    """Segments are cut in bytes: one item size's plan is not another's."""
    n, count = 3, SEGMENT_BYTES // 2 + 5  # one segment of 1-byte items, several of 8-byte ones
    for itemsize in (1, 2, 8):
        run_symbolically(plan_of(name, n, count, itemsize), count)


def test_checker_catches_a_wrong_plan():
    """The checker can fail: a tree plan with one reduction dropped, and two ranks that each wait to
    receive before they send."""
    ranks = plan_of("tree", 3, 4, 4)
    broken = [tuple(s for s in ranks[0] if s.kind != "recv_reduce" or s.source != 2), *ranks[1:]]
    with pytest.raises(PlanError):
        run_symbolically(broken, 4)
    stuck = [(plan.recv(1, ("output", 0, 1)), plan.Step("send", to=1, send=("input", 0, 1))),
             (plan.recv(0, ("output", 0, 1)), plan.Step("send", to=0, send=("input", 0, 1)))]
    with pytest.raises(PlanError, match="deadlock"):
        run_symbolically(stuck, 1)
    with pytest.raises(ValueError, match="deadlocks"):
        replay(stuck, 4, Network.uniform(2, 10.0, 5.0))


def test_blocking_sends_rely_on_no_buffering():
    """Two ranks that both send before they receive wait forever in a replay, as in MPI without
    buffering; the same with sendrecv ends."""
    both_send = [(plan.Step("send", to=1, send=("input", 0, 1)), plan.recv(1, ("output", 0, 1))),
                 (plan.Step("send", to=0, send=("input", 0, 1)), plan.recv(0, ("output", 0, 1)))]
    with pytest.raises(ValueError, match="deadlocks"):
        replay(both_send, 4, Network.uniform(2, 10.0, 5.0))
    exchange = [(plan.sendrecv(1, ("input", 0, 1), 1, ("output", 0, 1)),),
                (plan.sendrecv(0, ("input", 0, 1), 0, ("output", 0, 1)),)]
    assert replay(exchange, 4, Network.uniform(2, 10.0, 5.0)).seconds == pytest.approx(5e-6 + 4 / 10e9)


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_replay_prices_the_ring_at_its_closed_form(n):
    """2(N-1)(α + M/(Nβ)) on uniform links, for a vector that divides evenly."""
    alpha, beta = 5e-6, 10e9
    network = Network.uniform(n, beta / 1e9, alpha * 1e6)
    for count in (n, 1000 * n):
        seconds = replay(plan_of("ring", n, count, 4), 4, network).seconds
        assert seconds == pytest.approx(2 * (n - 1) * (alpha + 4 * count / n / beta), rel=1e-9)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_replay_prices_small_messages_by_the_steps(n):
    """At 8 bytes a plan costs its chain of messages: 2(N-1) α for the ring, 2 log2 N α for the
    binomial tree (so on 2 ranks the tree costs what the ring costs)."""
    alpha = 5e-6
    network = Network.uniform(n, 10.0, alpha * 1e6)
    ring = replay(plan_of("ring", n, 2, 4), 4, network).seconds
    tree = replay(plan_of("tree", n, 2, 4), 4, network).seconds
    assert ring == pytest.approx(2 * (n - 1) * alpha, rel=1e-3)
    assert tree == pytest.approx(2 * np.log2(n) * alpha, rel=1e-3)


def test_replay_charges_each_transport_step_its_own_cost():
    """o before each step that calls the transport, none for a copy or a reduction within a rank:
    on 2 ranks, α 5 us and o 1 us, the ring's two exchanges take 2(o + α), rd's exchange and
    reduction o + α, oneshot's copy, send, copy, receive and wait α + 2o (the receive's o within
    the message's way), the double tree's send, receive, send, wait, receive, wait 2α + 3o; where
    o outlasts α (o 4 us, α 3 us) its six steps take 6o. With every message taking 7 us
    (``message_seconds``, a time measured for its size) the ring takes 2(o + 7 us)."""
    def priced(name, alpha_us, step_us, message=None):
        network = Network.uniform(2, 1e6, alpha_us)  # 8-byte messages: their bytes cost ~0
        return replay(plan_of(name, 2, 2, 4), 4, network, step_us * 1e-6, message).seconds * 1e6

    for name, closed in (("ring", 12.0), ("rd", 6.0), ("oneshot", 7.0), ("dbtree", 13.0)):
        assert priced(name, 5.0, 1.0) == pytest.approx(closed, abs=1e-3), name
    assert priced("dbtree", 3.0, 4.0) == pytest.approx(24.0, abs=1e-3)
    assert priced("ring", 5.0, 1.0, lambda nbytes: 7e-6) == pytest.approx(16.0, abs=1e-9)
    with pytest.raises(ValueError, match="negative"):
        priced("ring", 5.0, -1.0)


@pytest.mark.parametrize("step_us, way_us", [(0.0, 5.0), (1.0, 5.0), (4.0, 3.0)])
def test_plan_fit_recovers_the_costs_its_probes_were_priced_at(step_us, way_us):
    """``bench plan-fit``'s fit, given the probes' times as the replay prices them from a call's
    cost c, a step's o and a message's way t(m) = t0 + m / (1 GB/s), finds c, o and t(m) again:
    where the three-step exchange's receive waits for the message (o <= t) and where it does not."""
    from bench.tools.plan_fit import exchange_in_three_steps, exchange_steps, exchanges_twice, fit
    call, network = 0.5e-6, Network.uniform(2, 1e6, 1.0)
    sizes = (8, 64, 512, 4096)

    def way(nbytes):
        return way_us * 1e-6 + nbytes / 1e9

    def timed(build):
        return np.array([call + replay([build(2, r, m // 4, 4) for r in range(2)], 4, network, step_us * 1e-6,
                                       way).seconds for m in sizes])
    found_call, found_step, found_way = fit(timed(exchange_steps), timed(exchanges_twice),
                                            timed(exchange_in_three_steps))
    assert found_call == pytest.approx(call, abs=1e-12) and found_step == pytest.approx(step_us * 1e-6, abs=1e-12)
    assert found_way == pytest.approx([way(m) for m in sizes], abs=1e-12)


def test_plan_fit_prices_the_plan_that_runs():
    """An algorithm of one node's shared memory runs its fallback where the ranks span nodes, and
    that is the plan priced: oneshot's rd, twoshot's ring; on one node their own."""
    from bench.tools.plan import plan_that_runs
    assert plan_that_runs("oneshot", [0, 1]) is REGISTERED["rd"]
    assert plan_that_runs("twoshot", [0, 0, 1]) is REGISTERED["ring"]
    assert plan_that_runs("oneshot", [0, 0]) is REGISTERED["oneshot"] and plan_that_runs("ring", [0, 1]) is REGISTERED["ring"]


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_replay_agrees_with_the_schedules(n):
    """The cost model's schedules of the ring and of the double binary tree, written apart from
    their plans, price them as the replay of the plans does within 2%: the ring from 8 B to 8 MiB
    (four segments), the double tree up to one segment a tree. (Where segments pipeline through
    a tree whose ranks have several children, the schedule, which gives every period the busiest
    port's time, and the replay, which moves each message when its port is free, part: dbtree at
    8 ranks and 8 MiB 7% apart, the binomial tree at 4 ranks and 1 MiB 24%. Not compared.)"""
    network = Network.uniform(n, 10.0, 5.0)
    model = cost_model(network)
    for name, counts in (("ring", (2, 1000, 1 << 18, 1 << 21)), ("dbtree", (2, 1000, 1 << 18))):
        for count in counts:
            priced = replay(plan_of(name, n, count, 4), 4, network).seconds
            assert priced == pytest.approx(model.time(name, 4 * count), rel=0.02), (name, count)


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("per_node", [1, 2])
def test_replay_counts_the_schedules_steps(n, per_node):
    """At 8 bytes the time is the start-ups on the longest chain of messages: every schedule and
    its plan's replay agree within 1% on nodes of one rank and of two (the parameter server's
    schedule aside: it sends the result to one worker after another, α each, where the replay
    overlaps the start-ups of sends in a row; and oneshot's, which prices its rounds over the
    node's boxes, half a message each, where its plan, one step of messages, runs only on the
    compiled engine: tests/test_plans.py's replay of it and `bench plan-fit` price that plan)."""
    network = Network.uniform(n, 10.0, 5.0, per_node)
    model = cost_model(network)
    for name in PLANNED:
        if name != "ps" and REGISTERED[name].schedule is not None and not REGISTERED[name].plan_when_compiled:
            priced = replay(plan_of(name, n, 2, 4, [r // per_node for r in range(n)]), 4, network).seconds
            assert priced == pytest.approx(model.time(name, 8), rel=0.01), name


@pytest.mark.parametrize("name", PLANNED)
def test_json_reads_back(name):
    ranks = plan_of(name, 5, 23, 2)
    document = json.loads(json.dumps(plan.as_json(name, 23, 2, ranks)))
    assert plan.from_json(document) == (name, 23, 2, [tuple(steps) for steps in ranks])


def test_json_refuses_what_is_not_a_plan():
    with pytest.raises(ValueError, match="format"):
        plan.from_json({"format": "something else"})
    document = plan.as_json("ring", 2, 4, plan_of("ring", 2, 2, 4))
    document["steps"][0][0]["kind"] = "teleport"
    with pytest.raises(ValueError, match="teleport"):
        plan.from_json(document)


def test_sends_blocking_merges_a_send_waited_for_at_once():
    steps = (plan.isend(1, ("input", 0, 2), 0), plan.wait(0), plan.isend(1, ("input", 0, 2), 1),
             plan.recv(1, ("output", 0, 2)), plan.wait(1))
    merged = plan.sends_blocking(steps)
    assert [s.kind for s in merged] == ["send", "isend", "recv", "wait"]


def run_plan_tool(*args):
    return subprocess.run([sys.executable, "-m", "bench", "plan", *args], capture_output=True, text=True, timeout=120)


def test_bench_plan_prints_each_rank_and_exports_json(tmp_path):
    out = tmp_path / "tree.json"
    proc = run_plan_tool("--algo", "tree", "-n", "4", "--count", "8", "-J", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    steps = [line.split() for line in lines if not line.startswith("#")]
    assert {int(fields[0]) for fields in steps} == {0, 1, 2, 3}
    document = json.loads(out.read_text())
    name, count, itemsize, ranks = plan.from_json(document)
    assert (name, count, itemsize, len(ranks)) == ("tree", 8, 4, 4)
    assert sum(len(r) for r in ranks) == len(steps)
    run_symbolically(ranks, count)
    # 2 log2 4 = 4 messages in a row of 5 us and 32 B at 10 GB/s
    assert document["modelled_us"] == pytest.approx(4 * (5 + 32 / 10e3), rel=1e-3)
    assert f"# modelled time {document['modelled_us']:.2f} us" in proc.stdout


def test_bench_plan_prints_the_plan_that_runs_across_nodes(tmp_path):
    """On 2 nodes of 2 ranks oneshot runs recursive doubling: bench plan prints and exports rd's
    plan (its steps exchange with one peer a step, as rd's own plan does), and says so; on one
    node, oneshot's own plan (one step of messages to every other rank)."""
    out = tmp_path / "oneshot.json"
    proc = run_plan_tool("--algo", "oneshot", "-n", "4", "--count", "8", "--ranks-per-node", "2", "-J", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "# oneshot runs rd's plan where its ranks span nodes" in proc.stdout
    name, count, itemsize, ranks = plan.from_json(json.loads(out.read_text()))
    assert name == "rd" and ranks == [tuple(steps) for steps in plan_of("rd", 4, 8, 4)]
    run_symbolically(ranks, count)
    alone = run_plan_tool("--algo", "oneshot", "-n", "4", "--count", "8", "-J", str(out))
    assert alone.returncode == 0 and "runs rd's plan" not in alone.stdout
    assert plan.from_json(json.loads(out.read_text()))[3] == [tuple(steps) for steps in plan_of("oneshot", 4, 8, 4)]


def test_bench_plan_refuses_what_it_cannot_print(tmp_path):
    unplanned = next((name for name, record in REGISTERED.items() if record.steps is None), None)
    if unplanned is not None:
        proc = run_plan_tool("--algo", unplanned, "-n", "4")
        assert proc.returncode == 2 and "choices" in proc.stderr
    proc = run_plan_tool("--algo", "ring")
    assert proc.returncode == 2 and "-n N" in proc.stderr
    proc = run_plan_tool("--algo", "bamtree", "-n", "3", "--topology", str(tmp_path / "missing.json"))
    assert proc.returncode == 2 and "missing.json" in proc.stderr


@pytest.mark.parametrize("k", [3, 4, 5])
def test_rabenseifner_plan_at_every_radix(k, monkeypatch):
    """ALLREDUCE_RADIX=k: k parts a step, sent at once, the groups folded in where N is not a
    power of k; a radix above N runs as N."""
    monkeypatch.setenv("ALLREDUCE_RADIX", str(k))
    for n in RANKS:
        for count in (0, 1, n + 1, 37):
            ranks = plan_of("rabenseifner", n, count, 4)
            run_symbolically(ranks, count, in_place=count % 2 == 1)
            replay(ranks, 4, Network.uniform(n, 10.0, 5.0))


@pytest.mark.parametrize("module", ["ring", "dring", "rabenseifner", "twoshot"])
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
@pytest.mark.parametrize("n", RANKS)
def test_half_plans(module, collective, n):
    """The halves as plans: the reduce-scatter with its partial sums in place, in a vector of the
    caller's and in scratch; the all-gather; the rings around the ranks' order and a shuffled one."""
    halves = importlib.import_module(f"algorithms.catalog.{module}")
    orders = (None, tuple(np.random.default_rng(n).permutation(n).tolist()))
    if module == "dring":  # it takes its order as bamring's record of one
        orders = (None, SimpleNamespace(order=orders[1]))
    given = [(order,) for order in orders] if module not in ("rabenseifner", "twoshot") else [()]
    network = Network.uniform(n, 10.0, 5.0)
    for count in (0, 1, n - 1, n + 1, 37, *((2 * SEGMENT_BYTES // 4 + 3,) if n in (2, 5) else ())):
        for extra in given:
            if collective == "all_gather":
                runs = [[halves.all_gather_steps(n, r, count, 4, *extra) for r in range(n)]]
            else:
                runs = [[halves.reduce_scatter_steps(n, r, count, 4, *extra, where) for r in range(n)]
                        for where in ("input", "partial", "scratch")]
            for ranks in runs:
                run_symbolically(ranks, count, collective=collective)
                replay(ranks, 4, network)


@pytest.mark.parametrize("n", RANKS)
def test_bruck_all_gather_plan(n):
    from algorithms.catalog import bruck
    for count in (0, 1, n - 1, n + 1, 37, 1001):
        ranks = [bruck.all_gather_steps(n, r, count, 4) for r in range(n)]
        run_symbolically(ranks, count, collective="all_gather")
        replay(ranks, 4, Network.uniform(n, 10.0, 5.0))


@pytest.mark.parametrize("k", [3, 4])
def test_rabenseifner_half_plans_at_a_higher_radix(k, monkeypatch):
    from algorithms.catalog import rabenseifner
    monkeypatch.setenv("ALLREDUCE_RADIX", str(k))
    for n in RANKS:
        for count in (0, 1, n + 1, 37):
            run_symbolically([rabenseifner.all_gather_steps(n, r, count, 4) for r in range(n)], count,
                             collective="all_gather")
            for where in ("input", "scratch"):
                run_symbolically([rabenseifner.reduce_scatter_steps(n, r, count, 4, where) for r in range(n)], count,
                                 collective="reduce_scatter")


@pytest.mark.parametrize("nodes", [[0, 0, 1, 1], [0, 1, 0, 1, 2], [0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 1, 1, 2],
                                   [0, 1, 2, 3], [0, 0, 0]])
def test_hier_plan_on_uneven_nodes(nodes, monkeypatch):
    """hier's plan of plans on nodes of every shape: interleaved, of different sizes (the last
    round padded), one rank each, one node; rings across, and the matched tree; and its halves."""
    from algorithms.catalog import hier
    n = len(nodes)
    for across in ("ring", "bamtree"):
        monkeypatch.setenv("ALLREDUCE_HIER_ACROSS", across)
        for count in (0, 1, n + 1, 37, 1001):
            ranks = plan_of("hier", n, count, 4, nodes)
            run_symbolically(ranks, count, in_place=count % 2 == 1)
            replay(ranks, 4, Network.uniform(n, 10.0, 5.0))
            shape = hier.plan_input(n, None, nodes) if across == "ring" else None
            for where in ("input", "partial", "scratch") if shape else ():
                run_symbolically([hier.reduce_scatter_steps(n, r, count, 4, shape, where) for r in range(n)], count,
                                 collective="reduce_scatter")
            if shape:
                run_symbolically([hier.all_gather_steps(n, r, count, 4, shape) for r in range(n)], count,
                                 collective="all_gather")


@pytest.mark.parametrize("ranks, engine", [(2, "auto"), (2, "python"), (3, "auto")])
def test_plan_fit_prices_every_algorithm_it_times(ranks, engine, tmp_path):
    """``bench plan-fit`` under a real mpiexec (3 ranks on 2 cores: a functional run, not a
    measurement), on either engine (on the Python one oneshot runs its rounds, which refuse a
    vector of another size than theirs): a row for every algorithm and size, a fit per round,
    each row's ratio its measured time over its price, and a verdict."""
    from bench.tools.plan_fit import FITTED
    out = tmp_path / "fit.json"
    proc = run_mpi(ranks, ["-m", "bench", "plan-fit", "-b", "8", "-e", "512", "-f", "8", "--rounds", "3",
                           "-J", str(out)], timeout=240, env={"ALLREDUCE_ENGINE": engine})
    assert proc.returncode == 0, proc.stderr[-3000:]
    document = json.loads(out.read_text())
    assert document["ranks"] == ranks and len(document["fits"]) == 3
    assert all(fit["alpha_us"] > 0 and fit["call_us"] >= 0 and fit["step_us"] >= 0 for fit in document["fits"])
    probed = [1 << k for k in range(2, 10)]  # every power of two from 4 B to the largest size, 512 B
    assert all(sorted(map(int, fit["message_us"])) == probed for fit in document["fits"])
    rows = {(row["bytes"], row["algorithm"]): row for row in document["rows"]}
    assert set(rows) == {(size, name) for size in (8, 64, 512) for name in FITTED}
    for row in rows.values():
        assert row["measured_us"]["low"] <= row["measured_us"]["median"] <= row["measured_us"]["high"]
        assert row["priced_us"]["median"] > 0
    table = [line.split() for line in proc.stdout.splitlines() if not line.startswith("#")]
    assert len(table) == len(rows) and {line[-1] for line in table} <= {"met", "missed", "tie"}
