"""PyTorch's two ways of data parallelism through our collectives (needs PyTorch; ``import
algorithms`` leaves this package alone): DDP's communication hook (:mod:`.ddp`) and FSDP2's
all-gathers and reduce-scatters (:mod:`.fsdp`, imported on first use of its names: importing
FSDP costs DDP users a second), with the tensor views and the communication thread the two
share (:mod:`.shared`).

    import algorithms.torch as art
    state = art.HookState(algorithm="ring")
    ddp_model.register_comm_hook(state, art.allreduce_hook)
"""

from .ddp import BucketCall, HookState, allreduce_hook, as_numpy, noop_hook, overlap_reached  # noqa: F401

_FSDP_NAMES = ("AllGather", "ReduceScatter", "CommCall", "shard_with", "exposed_seconds")


def __getattr__(name):
    if name in _FSDP_NAMES:
        from . import fsdp

        return getattr(fsdp, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
