"""The training wing: ``python -m bench train`` (:mod:`.tool`), what communication costs a
PyTorch training step, measured under two strategies behind the same calls (:mod:`.ddp`,
:mod:`.fsdp`) and set beside its prediction (:mod:`.predict`, :mod:`.predict_fsdp`), which
``python -m bench scaling --train`` projects to more ranks (:mod:`.projection`)."""
