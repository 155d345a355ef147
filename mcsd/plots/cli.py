"""Renamed :mod:`mcsd.commands.plot`. This name still imports (the same module) and runs
(``python -m mcsd.plots.cli``), with a deprecation line, until mcsd 0.2.0 (docs/layout.md, "Old names")."""

import sys
import warnings

from mcsd.commands import plot as _renamed

if __name__ == "__main__":  # python -m mcsd.plots.cli: the command, after one line on stderr
    print("mcsd.plots.cli is renamed mcsd.commands.plot: run python -m mcsd.commands.plot (the old name goes in mcsd 0.2.0)",
          file=sys.stderr)
    _renamed.main()
else:
    warnings.warn("mcsd.plots.cli is renamed mcsd.commands.plot: import that instead (the old name goes in mcsd 0.2.0)",
                  DeprecationWarning, stacklevel=2)
    sys.modules[__name__] = _renamed
