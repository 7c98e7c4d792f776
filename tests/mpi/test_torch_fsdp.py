"""FSDP2's all-gather and reduce-scatter through ``algorithms.torch`` on every rank: an MLP
trained a few steps under ``fully_shard`` with our collectives against FSDP's own gloo ones
(same model, same data), fp32 and bf16 mixed precision, synchronous and overlapped; and the two
comms called as FSDP calls them, against MPI's Allgather and Reduce_scatter_block.

Tolerances (max|p - g| / max|g| over each full parameter, against gloo's run): the all-gather
moves bits, so only the reduce-scatter's sum order differs. At 1 and 2 ranks the results agree
bit for bit (a sum of two is the same either way, and halving is exact); at 5 we measured
6e-8 in fp32, which 1e-6 bounds. In bf16 mixed precision (bf16 all-gathers and gradients,
fp32 parameters) a gradient rounded the other way differs by one unit in its 8th bit (2^-8 of
it), and an update (learning rate 0.1) is smaller than the parameter it moves: 2^-8 bounds it
(measured: 1e-4 at 5 ranks)."""

import math

import ml_dtypes
import numpy as np
import pytest
import torch
import torch.distributed as dist
from conftest import rank_input
from mpi4py import MPI
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import algorithms.torch as art

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("gloo_process_group")]

WIDTH, LAYERS, BATCH, STEPS = 64, 4, 8, 3
TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 2.0 ** -8}
ReduceOp = dist.ReduceOp


def mlp():
    torch.manual_seed(7)
    return torch.nn.Sequential(*[m for _ in range(LAYERS) for m in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())])


def sharded_model(dtype):
    """The MLP, ``fully_shard`` on each Linear, then on the root; bf16: FSDP's mixed precision."""
    model = mlp()
    policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=dtype) if dtype != torch.float32 else None
    kwargs = {"mp_policy": policy} if policy else {}
    for layer in model[::2]:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def train(dtype, algorithm=None, overlap=False):
    """The full parameters after ``STEPS`` SGD steps, each rank on its own data, and each
    step's records (with ``algorithm``: our comms; None: gloo's)."""
    model = sharded_model(dtype)
    comms = art.shard_with(model, algorithm, overlap=overlap) if algorithm else ()
    if overlap:  # forward prefetching too: layer i+1's all-gather issued in layer i's pre-forward
        layers = list(model[::2])
        for layer, following in zip(layers, layers[1:]):
            layer.set_modules_to_forward_prefetch([following])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(100 + MPI.COMM_WORLD.rank)
    steps = []
    for _ in range(STEPS):
        x, y = (torch.randn(BATCH, WIDTH, generator=generator) for _ in range(2))
        torch.nn.functional.mse_loss(model(x).float(), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        steps.append([call for c in comms for call in c.take()])
    for c in comms:
        c.close()
    return [p.full_tensor().detach().clone() for p in model.parameters()], steps


_RUNS = {}


def run(dtype, algorithm=None, overlap=False):
    key = (dtype, algorithm, overlap)
    if key not in _RUNS:
        _RUNS[key] = train(dtype, algorithm, overlap)
    return _RUNS[key]


def digest(parameters):
    return b"".join(art.as_numpy(p.contiguous().view(-1)).tobytes() for p in parameters)


def diffs(parameters, reference):
    """(max abs diff, max of each parameter's abs diff over its largest magnitude)"""
    pairs = [(p.double(), r.double()) for p, r in zip(parameters, reference)]
    return (max((p - r).abs().max().item() for p, r in pairs),
            max(((p - r).abs().max() / r.abs().max()).item() for p, r in pairs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("algorithm,overlap", [("ring", False), ("auto", False), ("ring", True)],
                         ids=["ring", "auto", "ring-overlap"])
def test_training_matches_fsdp_over_gloo(algorithm, overlap, dtype):
    comm = MPI.COMM_WORLD
    ours, steps = run(dtype, algorithm, overlap)
    reference, _ = run(dtype)
    assert len(set(comm.allgather(digest(ours)))) == 1, "parameters differ across ranks"
    absolute, relative = diffs(ours, reference)
    print(f"{comm.size} ranks, {algorithm}{' overlap' if overlap else ''}, {dtype}: max abs diff {absolute:.3g}, "
          f"max rel diff {relative:.3g}")
    assert relative <= TOLERANCE[dtype], (absolute, relative)
    if comm.size <= 2:
        assert digest(ours) == digest(reference)
    if overlap:  # the same collectives in the same order: the same bits
        assert digest(ours) == digest(run(dtype, algorithm)[0])
    assert digest(ours) != digest([p.detach() for p in mlp().parameters()])  # it trained
    check_records(steps, dtype, overlap)


def check_records(steps, dtype, overlap):
    """Per step: each layer all-gathered before its forward and again before its backward, its
    gradients reduce-scattered once (FSDP calls neither on one rank); each vector the layer's
    (W + 1) * W parameters, W padded on dim 0 to a multiple of N."""
    size = MPI.COMM_WORLD.size
    nbytes = math.ceil(WIDTH / size) * size * (WIDTH + 1) * (4 if dtype == torch.float32 else 2)
    assert len(steps) == STEPS
    for calls in steps:
        kinds = [c.kind for c in calls]
        expected = (2 * LAYERS, LAYERS) if size > 1 else (0, 0)
        assert (kinds.count("all_gather"), kinds.count("reduce_scatter")) == expected, kinds
        for c in calls:
            assert c.nbytes == nbytes and c.dtype == ("float32" if dtype == torch.float32 else "bfloat16")
            assert c.called <= c.started <= c.finished and c.exposed >= 0
            assert c.overlapped == (overlap and c.kind == "all_gather")  # FSDP's reduce-scatters are synchronous
            if not c.overlapped:  # the caller waited from the call until it finished
                assert c.exposed >= c.finished - c.called
        assert art.exposed_seconds(calls) == sum(c.exposed for c in calls)


def test_the_usage_as_documented():
    model = sharded_model(torch.float32)
    ag, rs = art.shard_with(model, algorithm="ring")  # comm=None -> MPI.COMM_WORLD
    torch.nn.functional.mse_loss(model(torch.ones(2, WIDTH)), torch.zeros(2, WIDTH)).backward()
    calls = ag.take() + rs.take()
    assert ag.comm is MPI.COMM_WORLD and len(calls) == (3 * LAYERS if MPI.COMM_WORLD.size > 1 else 0)
    assert ag.take() == [] and rs.take() == []
    with pytest.raises(ValueError, match="no FSDP module"):
        art.shard_with(torch.nn.Linear(2, 2))


TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def as_tensor(array, dtype):
    """A torch tensor of ``array``'s values (bf16 by its bits)."""
    if dtype == "bfloat16":
        return torch.from_numpy(array.astype(ml_dtypes.bfloat16).view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(array.astype(dtype))


@pytest.mark.parametrize("dtype", list(TORCH))
@pytest.mark.parametrize("overlap,async_op", [(False, False), (False, True), (True, False), (True, True)],
                         ids=["sync", "sync-async_op", "overlap", "overlap-async_op"])
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "input-apart"])
def test_all_gather_as_fsdp_calls_it(dtype, overlap, async_op, in_place, comm):
    """Output N shards of 37; input this rank's, as FSDP's view of the output or a tensor of its own."""
    rank, size, per = comm.rank, comm.size, 37
    mine = as_tensor(np.arange(per) * 1.5 + 100 * rank, dtype).double().numpy()  # the values the dtype holds
    expected = np.empty(per * size)
    comm.Allgather(mine, expected)
    output = torch.full((per * size,), -1.0).to(TORCH[dtype])
    if in_place:
        output[rank * per:(rank + 1) * per] = as_tensor(mine, dtype)
        input_tensor = output[rank * per:(rank + 1) * per]
    else:
        input_tensor = as_tensor(mine, dtype)
    with art.AllGather("ring", overlap=overlap) as ag:
        work = ag(output_tensor=output, input_tensor=input_tensor, group=dist.group.WORLD, async_op=async_op)
        assert (work is not None) == async_op
        if async_op:
            assert isinstance(work, dist.distributed_c10d.Work) and work.wait()
        [call] = ag.take()
    assert np.array_equal(output.double().numpy(), expected)
    assert (call.kind, call.nbytes, call.dtype, call.overlapped) == ("all_gather", output.nbytes, dtype,
                                                                      overlap and async_op)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int32, torch.float8_e4m3fn], ids=str)
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_all_gather_moves_any_dtype(dtype, overlap, comm):
    """The all-gather moves bytes: FSDP's own uint8 (a unit's shards of mixed dtypes), and any other
    dtype, against MPI's Allgather of the same bytes; 0-255 patterns that differ by rank."""
    rank, size, per = comm.rank, comm.size, 29
    itemsize = torch.empty(0, dtype=dtype).element_size()
    mine = ((np.arange(per * itemsize) * 7 + 31 * rank) % 256).astype(np.uint8)
    expected = np.empty(per * itemsize * size, dtype=np.uint8)
    comm.Allgather(mine, expected)
    output = torch.zeros(per * size, dtype=dtype)
    input_tensor = torch.from_numpy(mine.copy()).view(dtype)
    with art.AllGather("ring", overlap=overlap) as ag:
        ag(output_tensor=output, input_tensor=input_tensor, group=dist.group.WORLD)
        [call] = ag.take()
    assert np.array_equal(output.view(torch.uint8).numpy(), expected)
    assert (call.nbytes, call.dtype) == (output.nbytes, str(dtype).removeprefix("torch."))


class MixedDtypes(torch.nn.Module):
    """A trained fp32 layer and a frozen bf16 one in one FSDP unit (FSDP wants one dtype of the
    trained parameters only): FSDP all-gathers their shards together as uint8."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(11)
        self.first = torch.nn.Linear(WIDTH, WIDTH)
        self.second = torch.nn.Linear(WIDTH, WIDTH).to(torch.bfloat16).requires_grad_(False)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)).to(torch.bfloat16)).float()


def train_mixed(algorithm):
    """The full parameters after ``STEPS`` SGD steps of :class:`MixedDtypes`, and each collective's
    kind and dtype (with ``algorithm``)."""
    model = MixedDtypes()
    fully_shard(model)
    comms = art.shard_with(model, algorithm) if algorithm else ()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    generator = torch.Generator().manual_seed(300 + MPI.COMM_WORLD.rank)
    for _ in range(STEPS):
        x, y = (torch.randn(BATCH, WIDTH, generator=generator) for _ in range(2))
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    kinds = {(call.kind, call.dtype) for c in comms for call in c.take()}
    for c in comms:
        c.close()
    return [p.full_tensor().detach().clone() for p in model.parameters()], kinds


def test_mixed_dtypes_in_one_unit_match_fsdp_over_gloo(comm):
    ours, kinds = train_mixed("ring")
    reference, _ = train_mixed(None)
    assert len(set(comm.allgather(digest(ours)))) == 1, "parameters differ across ranks"
    assert [p.dtype for p in ours] == [torch.float32] * 2 + [torch.bfloat16] * 2
    if comm.size > 1:
        assert kinds == {("all_gather", "uint8"), ("reduce_scatter", "float32")}
    relative = diffs(ours, reference)[1]
    print(f"{comm.size} ranks, mixed dtypes: max rel diff {relative:.3g}")
    assert relative <= TOLERANCE[torch.float32], relative
    if comm.size <= 2:
        assert digest(ours) == digest(reference)


@pytest.mark.parametrize("dtype", list(TORCH))
@pytest.mark.parametrize("op", ["SUM", "AVG", "PREMUL_SUM", "MAX"])
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_reduce_scatter_as_fsdp_calls_it(dtype, op, overlap, comm):
    """Input N shards of 41 (small integers: exact sums in any order), against MPI's
    Reduce_scatter_block in float64 (PREMUL_SUM(0.25): of the inputs times 0.25); AVG: that sum
    divided by N in the dtype."""
    rank, size, per = comm.rank, comm.size, 41
    source = rank_input(dtype if dtype != "bfloat16" else ml_dtypes.bfloat16, "max" if op == "MAX" else "sum",
                        per * size, rank, size).astype(np.float64)
    expected = np.empty(per)
    comm.Reduce_scatter_block(source * (0.25 if op == "PREMUL_SUM" else 1), expected,
                              op=MPI.MAX if op == "MAX" else MPI.SUM)
    if op == "AVG":
        expected = (as_tensor(expected, dtype) / size).double().numpy()
    input_tensor, output = as_tensor(source, dtype), torch.zeros(per, dtype=TORCH[dtype])
    torch_op = ReduceOp.PREMUL_SUM(0.25) if op == "PREMUL_SUM" else getattr(ReduceOp, op)
    with art.ReduceScatter("ring", overlap=overlap) as rs:
        assert rs(output, input_tensor, dist.group.WORLD, torch_op) is None
        [call] = rs.take()
    assert np.array_equal(output.double().numpy(), expected)
    assert np.array_equal(input_tensor.double().numpy(), source)  # the input is read only
    assert (call.kind, call.nbytes, call.dtype, call.overlapped) == ("reduce_scatter", input_tensor.nbytes, dtype,
                                                                      False)


def test_what_they_refuse(comm):
    size = comm.size
    group = dist.group.WORLD
    with pytest.raises(ValueError, match="unknown algorithm 'nope' for the all-gather"):
        art.AllGather("nope")
    with pytest.raises(ValueError, match="unknown algorithm 'nope' for the reduce-scatter"):
        art.ReduceScatter(algorithm="nope")
    ag, rs = art.AllGather(), art.ReduceScatter()
    if size > 1:
        with pytest.raises(ValueError, match="do not divide over"):
            rs(torch.zeros(1), torch.zeros(size + 1), group, ReduceOp.SUM)
    with pytest.raises(ValueError, match="not one of"):
        ag(torch.zeros(2 * size), torch.zeros(3), group)
    with pytest.raises(ValueError, match="runs SUM, AVG"):
        rs(torch.zeros(1), torch.zeros(size), group, ReduceOp.BAND)
    with pytest.raises(TypeError, match="int32"):
        rs(torch.zeros(1, dtype=torch.int32), torch.zeros(size, dtype=torch.int32), group, ReduceOp.SUM)
    with pytest.raises(TypeError, match="strided"):
        ag(torch.zeros(4 * size)[::2], torch.zeros(2), group)
    if size > 1:
        with pytest.raises(ValueError, match="FSDP's group is rank"):
            art.AllGather(comm=MPI.COMM_SELF)(torch.zeros(size), torch.zeros(1), group)
    ag.close()
    with pytest.raises(RuntimeError, match="closed"):
        ag(torch.zeros(size), torch.zeros(1), group)
    assert ag.calls == [] and rs.calls == []


def test_an_error_reaches_the_waiting_caller(comm):
    """bamring without a bandwidth matrix raises alike on every rank: on the communication
    thread, then in Work.wait() (torch's own future-wrapping Work would swallow it)."""
    with art.AllGather("bamring", overlap=True) as ag:
        work = ag(torch.zeros(comm.size), torch.zeros(1), dist.group.WORLD, async_op=True)
        with pytest.raises(ValueError, match="link bandwidths"):
            work.wait()
        with pytest.raises(ValueError, match="link bandwidths"):  # synchronous: in the call
            ag(torch.zeros(comm.size), torch.zeros(1), dist.group.WORLD)
        assert [(c.overlapped, c.finished) for c in ag.take()] == [(True, None), (False, None)]  # recorded, unfinished


def test_the_overlapped_comms_share_one_thread_until_both_close():
    ag, rs = art.AllGather(overlap=True), art.ReduceScatter(overlap=True)
    thread = ag._worker.thread
    assert rs._worker is ag._worker and thread.is_alive() and thread.daemon
    ag.close()
    assert thread.is_alive()
    rs.close()
    rs.close()  # twice is fine
    assert not thread.is_alive()
