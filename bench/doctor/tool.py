"""``mpiexec -n N python -m bench doctor``: every rank gathers what it sees of itself, rank 0
prints one finding per problem, worst first (``bench/doctor``'s checks), and, with ``-J``,
writes them as JSON. Exit 0 with no finding, 1 with findings, 2 on an error."""

import json
import sys

from mpi4py import MPI

from plumbing.cli import Parser, pick
from plumbing.ending import describe_exception, end_job, fail_together
from plumbing.files import cannot_write, check_writable, write_json_atomically

from ..core.cli import size_type
from ..core.machine import results_header
from . import binding, facts, host, interfaces, measured, settings
from .finding import as_json, lines

PROG = "python -m bench doctor"
CHECKS = ("settings", "binding", "interfaces", "machine", "measured")
FOUND, ERROR = 1, 2
DESCRIPTION = ("What makes busbw low on this job's ranks (run it as the job runs: mpiexec -n N, or srun): leftover "
               "settings of NCCL, MPI, UCX and the suite, the ranks' binding, the interface that carries traffic "
               "between nodes, the machine (/dev/shm, huge pages, CPU governor, GPUs), and a short probe and sweep "
               "against the model of the probed links. Rank 0 prints each finding, worst first, with its evidence, "
               "cost and fix, and what it could not check. Exit 0 with no finding, 1 with findings, 2 on an error.")


def parse(argv):
    p = Parser(prog=PROG, description=DESCRIPTION)
    p.add_argument("--checks", default="all", metavar="LIST",
                   help=f"comma list of the checks to run, of {','.join(CHECKS)} (default all)")
    p.add_argument("-e", "--maxbytes", type=size_type, default="32M", metavar="BYTES",
                   help="the largest size the sweep you plan will run, for the /dev/shm check, K/M/G suffixes "
                        "(default 32M, the sweep's)")
    p.add_argument("-R", "--local_register", type=int, default=0, choices=(0, 1),
                   help="1: the sweep you plan runs with -R 1 (registered vectors in /dev/shm) (default 0)")
    p.add_argument("-J", "--output_file", metavar="FILE.json", help="the findings as JSON (default: none)")
    args = p.parse_args(argv)
    try:
        args.checks = pick(args.checks, {c: c for c in CHECKS}, "--checks", every="all")
    except ValueError as exc:
        p.error(str(exc))
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    comm = MPI.COMM_WORLD
    problem = None
    if args.output_file and comm.Get_rank() == 0:
        try:
            check_writable(args.output_file)
        except OSError as exc:
            problem = cannot_write(args.output_file, exc)
    if fail_together(comm, PROG, problem):
        return ERROR
    try:
        return run(comm, args, argv)
    except Exception as exc:  # noqa: BLE001 - every rank ends, exit 2: an error, not a finding
        end_job(ERROR, f"{PROG}: rank {comm.Get_rank()}: {describe_exception(exc)}")


def run(comm, args, argv):
    """Gather, measure, check; print and write on rank 0; the exit status on every rank."""
    job = facts.Job(comm.allgather(facts.gather()))
    between = interfaces.measure(comm, job) if "interfaces" in args.checks else None
    probed = measured.measure(comm) if "measured" in args.checks else None
    header = results_header("doctor", comm=comm, argv=["doctor", *argv])
    if comm.Get_rank():
        return comm.bcast(None, root=0)
    found, unchecked, carriers, table = [], [], {}, []
    if "settings" in args.checks:
        found += settings.check(job)
    if "interfaces" in args.checks:
        more, missing, carriers = interfaces.check(job, between)
        found, unchecked = found + more, unchecked + missing
    if "binding" in args.checks:
        more, missing = binding.check(job, carriers)
        found, unchecked = found + more, unchecked + missing
    if "machine" in args.checks:
        more, missing = host.check(job, args.maxbytes, bool(args.local_register))
        found, unchecked = found + more, unchecked + missing
    if "measured" in args.checks:
        more, missing, table = measured.check(job, probed)
        found, unchecked = found + more, unchecked + missing
    text = report(job, args, found, unchecked, table, between)
    print("\n".join(text), flush=True)
    if args.output_file:
        document = {**header, "hosts": [job.hosts(n) for n in job.nodes], "checks": args.checks,
                    **as_json(found, unchecked), "measured": table, "interfaces": between}
        write_json_atomically(args.output_file, json.loads(json.dumps(document, default=str)))
    return comm.bcast(FOUND if found else 0, root=0)


def report(job, args, found, unchecked, table, between):
    hosts = [h for node in job.nodes for h in job.hosts(node)]
    out = [f"# {PROG}: {len(job.ranks)} rank{'s' if len(job.ranks) > 1 else ''} on {len(job.nodes)} node{'s' if len(job.nodes) > 1 else ''} "
           f"({', '.join(hosts[:8])}{', ...' if len(hosts) > 8 else ''}); checks: {', '.join(args.checks)}"]
    for pair in between or []:
        rates = ", ".join(f"{n} {r * 8 / 1e6:.3g} Mbit/s" for n, r in pair["rates"].items() if r) or "none measured"
        out.append(f"# {job.hosts([pair['from']])[0]} -> {job.hosts([pair['to']])[0]}: MPI's bytes left through "
                   f"{pair['carrier'] or 'no interface the kernel counts'}; TCP over each interface: {rates}")
    for row in table:
        bound = f", bound {row['bound_GBps']:.3g}" if row["bound_GBps"] else ""
        busbw = row["busbw_GBps"]
        out.append(f"# ring {row['bytes']:>8} B: busbw {busbw['median']:.3g} GB/s [{busbw['ci_low']:.3g}, "
                   f"{busbw['ci_high']:.3g}], model {row['model_GBps']:.3g}{bound}")
    out += lines(found, unchecked)
    out.append(f"# {len(found)} finding{'s' if len(found) != 1 else ''}" + ("" if found else ": nothing found"))
    return out


