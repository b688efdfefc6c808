"""One optimization at a time: the GPU (or, without one, the CPU cores the interpreter needs) is
shared, so runs wait in line and the chat shows each waiting user their position.

Our own line rather than Gradio's concurrency_limit=1, so that questions ("why step 2?") and
history lookups never wait behind someone else's run.
"""
from __future__ import annotations

import itertools
import queue
import threading
import time
from typing import Callable, Iterator


class RunQueue:
    def __init__(self):
        self._cond = threading.Condition()
        self._line: list[int] = []          # tickets; the first one runs
        self._started: set[int] = set()
        self._tickets = itertools.count(1)

    def join(self) -> int:
        with self._cond:
            ticket = next(self._tickets)
            self._line.append(ticket)
            return ticket

    def ahead(self, ticket: int) -> int:
        """How many runs are ahead of `ticket` (0: its turn); -1 once it left the line."""
        with self._cond:
            return self._line.index(ticket) if ticket in self._line else -1

    def wait_turn(self, ticket: int) -> bool:
        """Block until `ticket` is first; False if it was cancelled meanwhile."""
        with self._cond:
            self._cond.wait_for(lambda: ticket not in self._line or self._line[0] == ticket)
            if ticket in self._line:
                self._started.add(ticket)   # from now on only leave() takes it out
                return True
            return False

    def cancel(self, ticket: int) -> None:
        """Give up a place that has not started yet (a started run cannot be taken back)."""
        with self._cond:
            if ticket in self._line and ticket not in self._started:
                self._line.remove(ticket)
                self._cond.notify_all()

    def leave(self, ticket: int) -> None:
        """A run is over: the next in line may start."""
        with self._cond:
            if ticket in self._line:
                self._line.remove(ticket)
            self._started.discard(ticket)
            self._cond.notify_all()


def run_in_line(line: RunQueue, job: Callable[[Callable[[dict], None]], object],
                poll_s: float = 0.5, tick_s: float | None = None) -> Iterator[tuple[str, object]]:
    """Run `job(on_event)` in a worker thread when its turn comes; yield what happens:
    ("wait", runs ahead) while waiting, ("event", ev) as the job reports, then ("done", result)
    or ("error", exception); with tick_s, also ("tick", seconds since it started) every tick_s
    while it runs, so a caller can say that a quiet run is still working.  Closing the iterator
    while waiting gives the place up; once started the job finishes (a verification in flight
    cannot be taken back) and then frees the line."""
    ticket = line.join()
    inbox: queue.Queue = queue.Queue()
    started = threading.Event()
    began: list[float] = []

    def work():
        try:
            if not line.wait_turn(ticket):
                return
            began.append(time.monotonic())
            started.set()
            inbox.put(("done", job(lambda ev: inbox.put(("event", ev)))))
        except Exception as exc:  # shown in the chat; the app keeps serving
            inbox.put(("error", exc))
        finally:
            if started.is_set():
                line.leave(ticket)

    threading.Thread(target=work, daemon=True, name=f"mtmc-run-{ticket}").start()
    last_ahead, last_tick = None, 0.0
    try:
        while True:
            try:
                item = inbox.get(timeout=poll_s)
            except queue.Empty:
                now = time.monotonic()
                if started.is_set():
                    if tick_s is not None and now - last_tick >= tick_s:
                        last_tick = now
                        yield "tick", now - began[0]
                    continue
                ahead = line.ahead(ticket)
                if not started.is_set() and ahead > 0 and ahead != last_ahead:
                    last_ahead = ahead
                    yield "wait", ahead
                continue
            yield item
            if item[0] in ("done", "error"):
                return
    finally:
        line.cancel(ticket)
