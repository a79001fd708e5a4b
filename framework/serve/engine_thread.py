"""The server's engine thread: the only thread that touches the engine.

HTTP handlers (on the asyncio loop) hand it requests and cancellations through a queue; it adds
them between steps, steps while anything is unfinished, and after each step posts every live
request's new tokens and text back to the handler's asyncio queue. Stop strings are matched here
on the detokenized text, so a matched request leaves the engine at once (``Engine.stop``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional

from servelab.engine.engine import Engine
from servelab.core.request import Request

log = logging.getLogger(__name__)

IDLE_WAIT_S = 0.05  # longest nap with nothing to run (a new request wakes the thread at once)


@dataclass
class Event:
    """One message to a handler: new tokens/text, and at the end the finish reason and counts."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: Optional[str] = None  # set on the last event
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: Optional[str] = None  # the request failed (e.g. the engine raised): message for a 500


@dataclass
class Submission:
    """A request on its way in, with where its events go (an asyncio queue on ``loop``)."""

    request: Request
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue
    stop: list[str] = field(default_factory=list)

    def post(self, event: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the handler's loop is gone (server shut down): nobody listens
            pass


class _Live:
    """Engine-thread state of one request: what its client has been sent so far."""

    __slots__ = ("sub", "seq", "sent_tokens", "sent_chars", "text")

    def __init__(self, sub: Submission, seq) -> None:
        self.sub, self.seq = sub, seq
        self.sent_tokens = self.sent_chars = 0
        self.text = ""


class EngineLoop:
    """Runs ``engine`` in a thread; ``submit``/``cancel``/``close`` are safe from any thread.

    ``decode(token_ids) -> str`` turns outputs into text (None: token ids only). ``on_step`` and
    ``on_queues`` feed the metrics.
    """

    def __init__(self, engine: Engine, decode: Optional[Callable[[list[int]], str]], max_waiting: int,
                 on_step: Callable | None = None, on_queues: Callable | None = None) -> None:
        self.engine, self.decode, self.max_waiting = engine, decode, max_waiting
        self.on_step, self.on_queues = on_step, on_queues
        self._inbox: deque = deque()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._live: dict[str, _Live] = {}
        self._closing = False
        self._stop = False
        self.num_waiting = 0  # the scheduler's waiting queue after the last step (read by handlers)
        self.error: Optional[str] = None
        self.thread = threading.Thread(target=self._run, name="servelab-engine", daemon=True)

    # ---- any thread ---------------------------------------------------------------------------
    def start(self) -> None:
        self.thread.start()

    def submit(self, sub: Submission) -> Optional[str]:
        """Queue ``sub`` for the engine; or say why not (shutting down, failed, too many waiting)."""
        with self._lock:
            if self._closing:
                return "the server is shutting down"
            if self.error:
                return f"the engine failed: {self.error}"
            pending = self.num_waiting + sum(1 for cmd in self._inbox if cmd[0] == "add")
            if pending >= self.max_waiting:
                return (f"server busy: {pending} requests already waiting (serve.max_waiting_requests="
                        f"{self.max_waiting}); retry later")
            self._inbox.append(("add", sub))
        self._wake.set()
        return None

    def abort_all(self) -> None:
        """Abort every live request now (end of the shutdown grace period): each stream then ends
        with ``finish_reason="abort"`` and ``data: [DONE]`` instead of a dropped connection."""
        self._inbox.append(("abort_all", None))
        self._wake.set()

    def cancel(self, request_id: str) -> None:
        """The client left: abort ``request_id`` wherever it is (no-op once it has ended)."""
        self._inbox.append(("abort", request_id))
        self._wake.set()

    def close(self) -> None:
        """Refuse new requests from now on; those in flight continue."""
        with self._lock:
            self._closing = True

    def stop(self, timeout: float = 60.0) -> None:
        """Abort whatever is still live, end the thread and wait for it."""
        self.close()
        self._stop = True
        self._wake.set()
        self.thread.join(timeout)

    # ---- the engine thread ----------------------------------------------------------------------
    def _run(self) -> None:
        engine = self.engine
        try:
            while True:
                self._wake.clear()
                self._drain_inbox()
                if self._stop:
                    self._abort_all()
                    return
                if engine.has_unfinished():
                    record = engine.step()
                    if record is not None and self.on_step is not None:
                        self.on_step(record)
                    self._publish()
                else:
                    if self.on_queues is not None:
                        self.on_queues()
                    self._wake.wait(IDLE_WAIT_S)
        except BaseException as exc:  # every live client hears of it; /health turns 503
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("engine thread failed; live requests get a 500 and new ones a 503")
            for live in list(self._live.values()):
                live.sub.post(Event(error=self.error, finish_reason="error"))
            self._live.clear()
            while self._inbox:
                cmd, arg = self._inbox.popleft()
                if cmd == "add":
                    arg.post(Event(error=self.error, finish_reason="error"))

    def _drain_inbox(self) -> None:
        while self._inbox:
            cmd, arg = self._inbox.popleft()
            if cmd == "add":
                self._add(arg)
            elif cmd == "abort_all":
                self._abort_all()
            elif arg in self._live:
                self.engine.abort(arg)
                self._emit(self._live[arg])
        self.num_waiting = self.engine.scheduler.queue_lengths().get("waiting", 0)

    def _add(self, sub: Submission) -> None:
        seq = self.engine.add_request(sub.request, sub.request.arrival_time)
        if seq.rejected_reason is not None:
            sub.post(Event(error=seq.rejected_reason, finish_reason="rejected", prompt_tokens=seq.prompt_len))
            return
        self._live[sub.request.id] = _Live(sub, seq)

    def _abort_all(self) -> None:
        for rid in list(self._live):
            self.engine.abort(rid)
            self._emit(self._live[rid])

    def _publish(self) -> None:
        for live in list(self._live.values()):
            if live.seq.num_output_tokens > live.sent_tokens or live.seq.is_finished:
                self._emit(live)

    def _emit(self, live: _Live) -> None:
        """Post ``live``'s new tokens and text; end it on a stop string; forget it once ended."""
        seq, sub = live.seq, live.sub
        outputs = seq.output_token_ids
        new_ids = list(outputs[live.sent_tokens:])
        live.sent_tokens = len(outputs)
        text, reason = "", seq.finish_reason
        if self.decode is not None:
            full = self.decode(outputs)
            if sub.stop and reason != "abort":
                cut = _first_stop(full, sub.stop, max(0, len(live.text) - max(map(len, sub.stop))))
                if cut is not None:
                    full = full[:cut]
                    if not seq.is_finished:
                        self.engine.stop(seq.id)
                    reason = "stop"  # also when the stop string came with the last token ("length" in the records)
            live.text = full
            end = len(full)
            if not seq.is_finished:  # hold back what may be the start of a stop string or a split character
                end -= max(map(len, sub.stop), default=1) - 1
                while end > live.sent_chars and full[end - 1] == "\ufffd":
                    end -= 1
            if end > live.sent_chars:
                text = full[live.sent_chars:end]
                live.sent_chars = end
        if seq.is_finished:
            del self._live[seq.id]
            sub.post(Event(text, new_ids, reason or seq.finish_reason, seq.prompt_len, seq.num_output_tokens))
        elif new_ids or text:
            sub.post(Event(text, new_ids))


def _first_stop(text: str, stops: list[str], start: int) -> Optional[int]:
    """Index in ``text`` where the earliest of ``stops`` begins (searching from ``start``), or None."""
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else None
