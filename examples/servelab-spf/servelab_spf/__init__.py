"""Shortest prompt first: admit the waiting request with the fewest prompt tokens next.

Installed with pip, it is selectable as ``python run.py scheduler=spf`` and its parameter as
``scheduler.longest_first=true``, with no change to servelab itself.
"""

from dataclasses import dataclass

from servelab.plugin_api import QueueScheduler, hookimpl


@dataclass
class SPFConfig:
    longest_first: bool = False  # flip the order (a worst-case baseline)


class ShortestPromptFirst(QueueScheduler):
    """Orders the waiting queue by prompt length (ties by arrival); running requests keep FCFS order."""

    name = "spf"
    Config = SPFConfig

    def waiting_key(self):
        sign = -1 if self.config.longest_first else 1
        return lambda seq: (sign * seq.prompt_len, seq.arrival_s)  # arrival on the scheduler's clock


@hookimpl
def servelab_register_schedulers():
    return [ShortestPromptFirst]
