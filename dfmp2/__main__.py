"""``python -m dfmp2``: the same commands as the ``dfmp2`` script (what torchrun -m starts)."""

from dfmp2.cli.main import main

if __name__ == "__main__":
    main()
