"""Renamed :mod:`mcsd.commands.probe`. This name still imports (the same module) and runs
(``python -m mcsd.probes.run``), with a deprecation line, until mcsd 0.2.0 (docs/layout.md, "Old names")."""

import sys
import warnings

from mcsd.commands import probe as _renamed

if __name__ == "__main__":  # python -m mcsd.probes.run: the command, after one line on stderr
    print("mcsd.probes.run is renamed mcsd.commands.probe: run python -m mcsd.commands.probe (the old name goes in mcsd 0.2.0)",
          file=sys.stderr)
    _renamed.main()
else:
    warnings.warn("mcsd.probes.run is renamed mcsd.commands.probe: import that instead (the old name goes in mcsd 0.2.0)",
                  DeprecationWarning, stacklevel=2)
    sys.modules[__name__] = _renamed
