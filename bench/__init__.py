"""nccl-tests-style benchmark driver for the all-reduce algorithms (``python -m bench``)."""
