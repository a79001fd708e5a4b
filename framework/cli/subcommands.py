"""The ``servelab <command>`` table: each subcommand once, with where it lives and what it does.

:mod:`servelab.cli.main` dispatches from it, ``servelab --help`` lists it (:func:`commands_help`), and an
unknown command's error names its entries; a new subcommand is one row here. Light on purpose (no Hydra,
no torch): the usage page imports it.
"""

from __future__ import annotations

from typing import NamedTuple


class Subcommand(NamedTuple):
    target: str  # "module:function" under servelab, called with the remaining arguments; returns an exit code
    summary: str  # one line for servelab --help


SUBCOMMANDS: dict[str, Subcommand] = {
    "profile": Subcommand("cli.profile:profile_main", "fit a step-time profile of the real engine on this machine"),
    "profile-ops": Subcommand("cli.profile_ops:main",
                              "operator tables (docs/op-tables.md) measured on this machine"),
    "eval-ppl": Subcommand("cli.eval_ppl:main", "held-out perplexity of the configured checkpoint (ppl.json)"),
    "bench": Subcommand("cli.bench:main",
                        "a load sweep (rates or concurrencies) of any stack: curve.csv/png, the SLO knee"),
    "compare": Subcommand("cli.compare:main", "runs side by side: a table of metrics and the keys that differ, a plot"),
    "report": Subcommand("cli.report:main", "a picture of runs: report.html with latency, load-over-time, replica "
                         "and tier figures"),
    "check-plugin": Subcommand("kit.conformance:main",
                               "a plugin through the conformance kit: exit 0 only when it passes"),
    "new-plugin": Subcommand("kit.new_plugin:main", "a plugin package skeleton: entry point, typed Config, a passing test"),
    "grade": Subcommand("kit.grading:main", "plugins scored against the built-ins on fixed simulated workloads"),
    "serve": Subcommand("serve.command:main",
                        "an OpenAI-compatible server (FastAPI + uvicorn) in front of the composed stack"),
    "route": Subcommand("serve.route.command:main",
                        "an OpenAI-compatible router (a router plugin) in front of N servers"),
}


def commands_help() -> list[str]:
    """The ``commands`` section of ``servelab --help``: one line per subcommand, in the table's order."""
    width = max(map(len, SUBCOMMANDS))
    return ["commands  (servelab <command> --help for each)",
            *(f"  {name:<{width}}  {entry.summary}" for name, entry in SUBCOMMANDS.items())]
