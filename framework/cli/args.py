"""What the override-taking subcommands (bench, eval-ppl, profile, profile-ops) share about their arguments."""

from __future__ import annotations

from servelab.core.errors import ConfigError


def refuse_flags(argv: list[str], command: str, takes: str = "") -> None:
    """An argument starting with ``-`` is no Hydra override (Hydra would answer ``--bogus`` with a lexer
    error): one line naming it and what ``servelab <command>`` takes (``takes``: its own flags, if any)."""
    flag = next((a for a in argv if a.startswith("-")), None)
    if flag is not None:
        raise ConfigError(f"unknown option {flag}: servelab {command} takes {takes + ' and ' if takes else ''}"
                          f"Hydra overrides (key=value); servelab {command} --help")
