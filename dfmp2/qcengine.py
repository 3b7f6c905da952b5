"""``import dfmp2.qcengine`` registers program ``dfmp2`` with QCEngine (the harness lives in
dfmp2.interfaces.qcengine; importing it registers)."""

from dfmp2.interfaces.qcengine import DFMP2Harness, register

__all__ = ["DFMP2Harness", "register"]
