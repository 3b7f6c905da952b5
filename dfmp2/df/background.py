"""One background thread with a bounded window: the read-ahead and write-behind of the run.

    bg = Background("dfmp2-prefetch", depth=2)         read ahead: results in order
    for block in bg.map(read, order): ...               (depth computed ahead of the one held)
    bg.close()

    bg = Background("dfmp2-writer", depth=3)            write behind: results dropped
    bg.put(write, a, piece); ...; bg.wait()             (at most depth calls outstanding)
    bg.close()

Users: the out-of-core store's reader and writer (dfmp2.df.outofcore.HDF5B) and the host integral
engine's libcint producer (dfmp2.df.integrals), which all overlap I/O or libcint (both release the
GIL) with the caller's torch work.

Guarantees:
  * order: calls run one at a time on one thread (a single-worker ThreadPoolExecutor), in the
    order they were submitted; ``map`` yields in the order of ``items``;
  * bounded: at most ``depth`` calls are outstanding (submitted and not yet collected by the
    caller); ``put`` and ``map`` wait for the oldest before submitting more. A result the caller
    holds (``map``) is not outstanding: the host engine's ring of depth + 1 buffers relies on it;
  * errors: an exception raised in a call (any BaseException) reaches the caller as the same
    object, where that call's result is collected (``map``: in its place in the order; ``put``:
    at a later ``put`` or ``wait``); the calls after a failed one are skipped;
  * stop: ``close`` (also ``with``, and ``map``'s generator when closed or left by an exception)
    cancels the calls not started and waits for the running one, at most one call's time. A
    caller blocked waiting for a result stays interruptible (Ctrl-C raises KeyboardInterrupt in
    it at once: lock waits are interruptible in Python 3).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice


class Background:
    """One worker thread named ``name`` running submitted calls in order, at most ``depth``
    outstanding (see the module docstring). One use per object: ``map`` or ``put``/``wait``."""

    def __init__(self, name: str, depth: int):
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        self.depth = depth
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._pending: deque[Future] = deque()
        self._halted = False  # a call failed, or close() began: skip what is queued

    def _call(self, fn: Callable, args: tuple):
        if self._halted:
            return None
        try:
            return fn(*args)
        except BaseException:
            self._halted = True
            raise

    def _submit(self, fn: Callable, *args) -> None:
        self._pending.append(self._pool.submit(self._call, fn, args))

    def _collect(self):
        """The oldest outstanding call's result, waiting for it; its exception is raised here."""
        return self._pending.popleft().result()

    # ---- write behind
    def put(self, fn: Callable, *args) -> None:
        """Run fn(*args) after every call put before; the error of an earlier call is raised
        here (at once when that call has finished, else once ``depth`` calls wait)."""
        while self._pending and (self._pending[0].done() or len(self._pending) >= max(1, self.depth)):
            self._collect()
        self._submit(fn, *args)

    def wait(self) -> None:
        """Wait for every call put so far; raise the first error among them."""
        while self._pending:
            self._collect()

    # ---- read ahead
    def map(self, fn: Callable, items: Iterable) -> Generator:
        """fn(item) for item in ``items``, in order, computed on the thread while the caller uses
        the previous results: ``depth`` calls ahead of the one the caller holds (0: each call
        made when asked for). The caller is done with a result when it asks for the next."""
        it = iter(items)

        def top_up(n: int) -> None:
            for item in islice(it, max(0, n - len(self._pending))):
                self._submit(fn, item)

        try:
            while True:
                top_up(max(1, self.depth))
                if not self._pending:
                    return
                result = self._collect()
                top_up(self.depth)
                yield result
        finally:
            self.close()

    # ---- stop
    def close(self) -> None:
        """Cancel the calls not started, wait for the running one; idempotent."""
        self._halted = True
        for f in self._pending:
            f.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
