"""``python without_this_tree.py -m MODULE ARGS...``: run MODULE as ``python -m`` would, with this
tree's editable install out of the way (its import hook removed), so that the code imported is
whatever else is on the path: an installed wheel under test."""

import runpy
import sys

sys.meta_path[:] = [finder for finder in sys.meta_path if not type(finder).__module__.startswith("__editable__")]
if sys.argv[1:2] != ["-m"] or len(sys.argv) < 3:
    raise SystemExit("usage: python without_this_tree.py -m MODULE [ARGS...]")
module = sys.argv[2]
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
