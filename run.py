"""servelab command line: compose the config with Hydra, build the stack, run the workload, report.

    python run.py                                   # the default stack on the shipped model (model=tiny_code)
    python run.py scheduler=fcfs allocator=paged block_size=16
    python run.py -m block_size=8,16,32             # a Hydra multirun
    python run.py --cfg job                         # print the composed config
"""

from servelab.cli.main import main

if __name__ == "__main__":
    main()
