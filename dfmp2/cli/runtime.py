"""What every long CLI command runs under: the lazy progress bar, and SIGTERM/SIGHUP raising in
the main thread (as Ctrl-C does) with a watchdog that ends a run stuck in one C call. Used by
``cli`` (run, interaction) and ``gradcli`` (gradient, optimize)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time

from dfmp2.errors import EXIT_INTERRUPTED, Terminated


class LazyProgress:
    """A rich progress bar that appears only once the work has run longer than ``after`` s."""

    def __init__(self, console, label: str, after: float = 2.0, enabled: bool = True):
        self.console, self.label, self.after, self.enabled = console, label, after, enabled
        self.t0, self.bar, self.task = time.perf_counter(), None, None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            if time.perf_counter() - self.t0 < self.after or done >= total:
                return
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

            self.bar = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=total)
        self.bar.update(self.task, completed=done)
        if done >= total:
            self.close()

    def close(self):
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


# After SIGTERM, SIGHUP or Ctrl-C, the seconds the main thread has to get back to Python (where the
# signal's exception unwinds the run) before the watchdog removes the temporary directories and
# ends the process itself
TERMINATE_GRACE_S = 10.0


@contextlib.contextmanager
def terminate_raises():
    """While the run goes on, SIGTERM and SIGHUP raise ``errors.Terminated`` (a KeyboardInterrupt)
    in the main thread, as Ctrl-C does, so every ``finally`` runs: temporary files are removed, a
    checkpoint is closed. Python runs a signal's handler only between bytecodes, so a main thread
    inside one long C call (PySCF's DF build, a BLAS call) would not stop until it returns (minutes,
    once: scripts/results/docstring-measurements.md): the watchdog (``_watchdog``) ends such a run
    after TERMINATE_GRACE_S."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupt(signum, frame):
        raise Terminated(signum, signal.Signals(signum).name)

    sigs = [s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None]
    old = {s: signal.signal(s, raise_interrupt) for s in sigs}
    try:
        with _watchdog({*sigs, signal.SIGINT}):
            yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextlib.contextmanager
def _watchdog(signums: set):
    """A thread that learns of each of ``signums`` when it arrives (``signal.set_wakeup_fd``: the
    C-level handler writes the signal's number to a pipe, whatever the main thread is doing) and,
    if the run has not ended TERMINATE_GRACE_S later, removes the registered temporary
    directories (``tempdirs``), prints the one error line and ends the process with 128 + the
    signal's number. A checkpoint stays as last flushed (its done flags), as after Ctrl-C."""
    import os

    from dfmp2.io import tempdirs

    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:  # not the main thread of the main interpreter
        os.close(r), os.close(w)
        yield
        return
    done = threading.Event()

    def watch():
        while True:
            data = os.read(r, 64)
            if not data or done.is_set():
                return
            hit = [b for b in data if b in signums]
            if hit and not done.wait(TERMINATE_GRACE_S):
                tempdirs.remove_all()
                name = signal.Signals(hit[0]).name
                by = "" if hit[0] == signal.SIGINT else f" by {name}"
                os.write(
                    2,
                    f"error: interrupted{by} (the work under way did not stop within "
                    f"{TERMINATE_GRACE_S:g} s: ended, temporary files removed)\n".encode(),
                )
                os._exit(EXIT_INTERRUPTED if hit[0] == signal.SIGINT else 128 + hit[0])

    t = threading.Thread(target=watch, name="dfmp2-watchdog", daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(old_fd)
        os.close(w)  # the watchdog reads the end of the pipe and returns
        t.join()
        os.close(r)
