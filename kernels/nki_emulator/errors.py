"""Errors raised by the NumPy execution of NKI kernels."""


class NkiEmulatorError(RuntimeError):
    """A kernel did something the emulator refuses: a hardware-limit violation, a misuse
    of a memory type, a read of uninitialised on-chip memory, or a construct outside
    the NKI subset the emulator implements."""


class HardwareLimitError(NkiEmulatorError):
    """A documented NeuronCore limit was exceeded (partitions, matmul tile free sizes,
    PSUM banks, SBUF capacity per partition)."""


class UnsupportedError(NkiEmulatorError):
    """The kernel used an NKI construct outside the subset this emulator implements.
    That does not mean the construct is invalid NKI; it means the emulator cannot vouch for it."""
