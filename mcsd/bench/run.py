"""Renamed :mod:`mcsd.commands.bench`. This name still imports (the same module) and runs
(``python -m mcsd.bench.run``), with a deprecation line, until mcsd 0.2.0 (docs/layout.md, "Old names")."""

import sys
import warnings

from mcsd.commands import bench as _renamed

if __name__ == "__main__":  # python -m mcsd.bench.run: the command, after one line on stderr
    print("mcsd.bench.run is renamed mcsd.commands.bench: run python -m mcsd.commands.bench (the old name goes in mcsd 0.2.0)",
          file=sys.stderr)
    _renamed.main()
else:
    warnings.warn("mcsd.bench.run is renamed mcsd.commands.bench: import that instead (the old name goes in mcsd 0.2.0)",
                  DeprecationWarning, stacklevel=2)
    sys.modules[__name__] = _renamed
