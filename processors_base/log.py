"""The logger user functions write to (``from processors_base import logger``)."""

import logging

logger = logging.getLogger("processors")

__all__ = ["logger"]
