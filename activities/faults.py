"""The fault hook (``CAIRN_FAULT``) lives in ``cairn.faults``: rank processes use it too."""

from cairn.faults import maybe_crash

__all__ = ["maybe_crash"]
