"""The DDP communication hook of ``algorithms.torch`` on every rank, against DDP's own gloo
all-reduce on the same model and data: the parameters after a few steps close to gloo's and
bit for bit the same on every rank, synchronous and overlapping, fp32 and bf16; the NumPy view
shares the bucket's memory; errors reach the training thread; the records say what ran when.

Tolerances (max|p - g| / max|g| over each parameter, against gloo's run): DDP's gloo path
divides each rank's gradient by the rank count and then sums, ours sums and then divides, and
the two sum in different orders; at 1 and 2 ranks (a division by 1 or 2 is exact) the results
agree bit for bit, at 3 they differ in the gradients' last bits. After a few SGD steps of
learning rate 0.1 that moves fp32 parameters by about 1e-7 of their largest magnitude (3
ranks); 1e-6 bounds it. bf16 keeps 8 significant bits, so one gradient rounded the other way can round an
updated parameter one unit in its last place (2^-8 of it) the other way: 2^-6, four such
units, bounds it."""


import numpy as np
import pytest
import torch
from mpi4py import MPI

import algorithms
import algorithms.torch as art

pytestmark = [pytest.mark.mpi, pytest.mark.usefixtures("gloo_process_group")]

WIDTH, LAYERS, BATCH, STEPS = 48, 3, 8, 3
BUCKET_MB = 0.004  # 4 KiB buckets: the 3 layers' 7056 parameters go in several, in fp32 and bf16
TOLERANCE = {torch.float32: 1e-6, torch.bfloat16: 2.0 ** -6}


def model(dtype):
    torch.manual_seed(7)
    layers = [m for _ in range(LAYERS) for m in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())]
    return torch.nn.Sequential(*layers).to(dtype)


def train(dtype, hook=None, state=None, steps=STEPS):
    """The parameters after ``steps`` SGD steps under DDP, each rank on its own data; with a
    hook, ``state.steps`` gets each step's calls (``state.take()`` after each)."""
    ddp = torch.nn.parallel.DistributedDataParallel(model(dtype), bucket_cap_mb=BUCKET_MB)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(100 + MPI.COMM_WORLD.rank)
    for _ in range(steps):
        x, y = (torch.randn(BATCH, WIDTH, generator=generator).to(dtype) for _ in range(2))
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        if state is not None:
            state.steps = [*getattr(state, "steps", []), state.take()]
    return [p.detach().clone() for p in ddp.module.parameters()]


_GLOO = {}


def gloo_run(dtype):
    if dtype not in _GLOO:
        _GLOO[dtype] = train(dtype)
    return _GLOO[dtype]


def digest(parameters):
    return b"".join(art.as_numpy(p.contiguous().view(-1)).tobytes() for p in parameters)


def largest_rel_diff(parameters, reference):
    return max(((p.double() - r.double()).abs().max() / r.double().abs().max()).item()
               for p, r in zip(parameters, reference))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
@pytest.mark.parametrize("algorithm", ["ring", "auto", "rd"])
def test_hook_matches_gloo_and_every_rank_agrees(algorithm, overlap, dtype):
    comm = MPI.COMM_WORLD
    with art.HookState(algorithm=algorithm, overlap=overlap) as state:
        ours = train(dtype, art.allreduce_hook, state)
    reference = gloo_run(dtype)
    assert len(set(comm.allgather(digest(ours)))) == 1, "parameters differ across ranks"
    assert len(set(comm.allgather(digest(reference)))) == 1, "gloo's parameters differ across ranks"
    worst = largest_rel_diff(ours, reference)
    assert worst <= TOLERANCE[dtype], worst
    if comm.size <= 2:  # dividing by 1 or 2 is exact: the same bits as gloo's divide-then-sum
        assert digest(ours) == digest(reference)
    assert digest(ours) != digest([p.detach() for p in model(dtype).parameters()])  # it trained
    # the records: every bucket of every step (DDP rebuilds its buckets after the first), in DDP's
    # order, their bytes the whole gradient's, each reduced after it was handed over
    itemsize = 4 if dtype == torch.float32 else 2
    for calls in state.steps:
        assert [c.index for c in calls] == list(range(len(calls)))
        assert sum(c.nbytes for c in calls) == sum(p.numel() for p in reference) * itemsize
        for c in calls:
            assert c.called <= c.started <= c.finished and c.overlapped == overlap
            assert c.dtype == ("float32" if dtype == torch.float32 else "bfloat16")
    assert len(state.steps) == STEPS and len(state.steps[-1]) >= 2, [len(c) for c in state.steps]
    reached = art.overlap_reached(state.steps[-1])
    assert (0 <= reached <= 1) if overlap else reached == 0


def test_the_usage_as_documented():
    """The five lines of the module docstring, as a user writes them."""
    ddp_model = torch.nn.parallel.DistributedDataParallel(model(torch.float32), bucket_cap_mb=BUCKET_MB)
    import algorithms.torch as art
    state = art.HookState(algorithm="ring")          # comm=None -> MPI.COMM_WORLD
    ddp_model.register_comm_hook(state, art.allreduce_hook)
    torch.nn.functional.mse_loss(ddp_model(torch.ones(2, WIDTH)), torch.zeros(2, WIDTH)).backward()
    assert state.comm is MPI.COMM_WORLD and len(state.calls) >= 1


def test_noop_hook_leaves_each_rank_its_own_gradients():
    comm = MPI.COMM_WORLD
    state = art.HookState()
    ours = train(torch.float32, art.noop_hook, state)
    distinct = len(set(comm.allgather(digest(ours))))
    assert distinct == comm.size  # different data per rank, nothing averaged
    assert all(c.seconds == 0 and not c.overlapped for calls in state.steps for c in calls)
    assert art.overlap_reached(state.steps[-1]) is None


@pytest.mark.parametrize("dtype,numpy_name", [(torch.float32, "float32"), (torch.float16, "float16"),
                                              (torch.float64, "float64"), (torch.bfloat16, "bfloat16")])
def test_the_numpy_view_shares_the_tensors_memory(dtype, numpy_name):
    tensor = torch.arange(10, dtype=torch.float32).to(dtype)
    view = art.as_numpy(tensor)
    assert view.dtype.name == numpy_name and view.shape == (10,)
    assert view.ctypes.data == tensor.data_ptr() and view.base is not None
    assert np.array_equal(view.astype(np.float64), np.arange(10.0))
    view[3] = 100  # written through the view, read back through the tensor
    assert tensor[3].item() == 100
    algorithms.allreduce(view, view, op="avg", algorithm="ring")  # every rank has the same: unchanged
    assert tensor.double().tolist() == [0, 1, 2, 100, 4, 5, 6, 7, 8, 9]


def test_unsupported_tensors_raise_type_error():
    for tensor, words in [(torch.zeros(4, dtype=torch.int32), "tensor of int32 on cpu"),
                          (torch.zeros(4, device="meta"), "on meta"),
                          (torch.zeros(4, 4).t(), "contiguous"),
                          (np.zeros(4), "torch.Tensor")]:
        with pytest.raises(TypeError, match=words):
            art.as_numpy(tensor)
    with pytest.raises(ValueError, match="unknown algorithm 'nope'"):
        art.HookState(algorithm="nope")


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "overlap"])
def test_an_all_reduce_error_reaches_the_training_thread(overlap):
    """bamtree without a bandwidth matrix: every rank's all-reduce raises alike; from the
    communication thread, by the Future's set_exception, which DDP's backward raises."""
    state = art.HookState(algorithm="bamtree", overlap=overlap)
    with pytest.raises(Exception, match="builds its tree from link bandwidths"):
        train(torch.float32, art.allreduce_hook, state, steps=1)
    state.close()
    assert state.calls == []


def test_close_stops_the_thread_and_a_closed_state_refuses():
    with art.HookState(algorithm="ring", overlap=True) as state:
        thread = state._thread
        assert thread.is_alive() and thread.daemon
    assert not thread.is_alive()
    state.close()  # twice is fine

    class Bucket:  # what DDP passes: buffer() and index()
        def buffer(self):
            return torch.zeros(4)

        def index(self):
            return 0
    with pytest.raises(RuntimeError, match="closed"):
        art.allreduce_hook(state, Bucket())


def test_the_hook_records_each_bucket_and_keeps_its_view():
    """The hook's own work per bucket on a one-rank communicator, where nothing moves: each call
    leaves one record, and the NumPy view of a bucket is made once and kept while DDP hands over
    the same memory. What that work costs over a bare all-reduce is measured by ``bench train``
    (``hook_over_bare``, a paired ratio with its interval, per bucket size), not timed here."""
    tensor = torch.zeros(1 << 16)
    state = art.HookState(algorithm="ring", comm=MPI.COMM_SELF)

    class Bucket:
        def buffer(self):
            return tensor

        def index(self):
            return 0
    bucket = Bucket()
    for _ in range(10):
        tensor.fill_(3.0)
        art.allreduce_hook(state, bucket).wait()
        assert torch.all(tensor == 3.0)  # the average over one rank
    assert len(state.take()) == 10
    kept = state.view_of(bucket)[1]  # one view per bucket, kept while DDP hands over the same memory
    assert kept is state.view_of(bucket)[1] and kept.ctypes.data == tensor.data_ptr()
