"""A Ctrl-C (SIGINT) that Python would lose still stops the run.

Python raises ``KeyboardInterrupt`` wherever the main thread is when SIGINT's handler runs. When that is
inside a ``__del__`` or a weakref callback (the garbage collector runs them at any allocation), Python
prints ``Exception ignored in ...`` and goes on: the interrupt is lost and the run trains on. Seen in the
suite: a SIGINT that landed in the ``regex`` package's ``Group.__del__`` while a reward ran; the run went on
for minutes.

While :meth:`Trainer.train` runs in the main thread with Python's own SIGINT handler in place,
:func:`catch_lost_interrupts` puts in a handler that also records the signal; the training loop calls the
``check`` it yields between steps, which raises ``KeyboardInterrupt`` when a SIGINT came and its exception was
lost. A user's own SIGINT handler, or a run outside the main thread, is left as it is.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


def _nothing() -> None:
    return None


@contextmanager
def catch_lost_interrupts() -> Iterator[Callable[[], None]]:
    """Yield ``check()``: raises ``KeyboardInterrupt`` when a SIGINT arrived inside the block (its first
    ``KeyboardInterrupt`` may have been swallowed); restores Python's handler on the way out."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        yield _nothing
        return
    came: list[int] = []

    def handler(sig, frame):
        came.append(sig)
        raise KeyboardInterrupt

    def check() -> None:
        if came:
            raise KeyboardInterrupt("a SIGINT whose KeyboardInterrupt was lost (raised inside a __del__ or a "
                                    "weakref callback, where Python ignores exceptions)")
    signal.signal(signal.SIGINT, handler)
    try:
        yield check
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
