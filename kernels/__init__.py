"""dfmp2's device kernels: nki (Trainium), triton (CUDA), cpu (C through ctypes), nki_emulator."""

if __name__ != "dfmp2.kernels":  # one module, one name: never loaded twice as two classes
    raise ImportError(f"the kernel layer is dfmp2.kernels; import it by that name, not as {__name__!r}")
