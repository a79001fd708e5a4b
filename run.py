"""servelab command line: compose the config with Hydra, build the stack, run the workload, report.

    python run.py                                   # the default stack on the embedded tiny model
    python run.py scheduler=fcfs allocator=paged block_size=16
    python run.py -m block_size=8,16,32             # a Hydra multirun
    python run.py --cfg job                         # print the composed config
"""

import os
import sys

# The repo's folders (kernels/, plugins/, conf/) are installed as parts of the `servelab` package.
# Keep the repo root off sys.path so they never shadow real top-level packages: transformers
# probes for an HF package named `kernels`.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]

from servelab.cli.main import main  # noqa: E402

if __name__ == "__main__":
    main()
