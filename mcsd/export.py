"""Renamed :mod:`mcsd.commands.export`. This name still imports (the same module) and runs
(``python -m mcsd.export``), with a deprecation line, until mcsd 0.2.0 (docs/layout.md, "Old names")."""

import sys
import warnings

from mcsd.commands import export as _renamed

if __name__ == "__main__":  # python -m mcsd.export: the command, after one line on stderr
    print("mcsd.export is renamed mcsd.commands.export: run python -m mcsd.commands.export (the old name goes in mcsd 0.2.0)",
          file=sys.stderr)
    _renamed.main()
else:
    warnings.warn("mcsd.export is renamed mcsd.commands.export: import that instead (the old name goes in mcsd 0.2.0)",
                  DeprecationWarning, stacklevel=2)
    sys.modules[__name__] = _renamed
