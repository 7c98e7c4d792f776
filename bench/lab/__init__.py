"""The heterogeneous network lab: an emulated cluster of network namespaces with uneven,
HTB-shaped links (:mod:`bench.lab.network`), and the experiments run on it
(:mod:`bench.lab.experiments`). ``python -m bench.lab`` or ``jobs/lab/run-lab.sh``."""
