"""Chaos tests import their helpers (the fault proxy) as plain modules."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
