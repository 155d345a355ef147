"""Renamed :mod:`mcsd.commands.app`. This name still imports (the same module), with a deprecation
warning, until mcsd 0.2.0 (docs/layout.md, "Old names")."""

import sys
import warnings

from mcsd.commands import app as _renamed

warnings.warn("mcsd.cli is renamed mcsd.commands.app: import that instead (the old name goes in mcsd 0.2.0)",
              DeprecationWarning, stacklevel=2)
sys.modules[__name__] = _renamed
