"""Renamed :mod:`mcsd.commands.train`. This name still imports (the same module) and runs
(``python -m mcsd.train``), with a deprecation line, until mcsd 0.2.0 (docs/layout.md, "Old names")."""

import sys
import warnings

from mcsd.commands import train as _renamed

if __name__ == "__main__":  # python -m mcsd.train: the command, after one line on stderr
    print("mcsd.train is renamed mcsd.commands.train: run python -m mcsd.commands.train (the old name goes in mcsd 0.2.0)",
          file=sys.stderr)
    _renamed.main()
else:
    warnings.warn("mcsd.train is renamed mcsd.commands.train: import that instead (the old name goes in mcsd 0.2.0)",
                  DeprecationWarning, stacklevel=2)
    sys.modules[__name__] = _renamed
