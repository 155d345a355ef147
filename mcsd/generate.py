"""Renamed :mod:`mcsd.commands.generate`. This name still imports (the same module) and runs
(``python -m mcsd.generate``), with a deprecation line, until mcsd 0.2.0 (docs/layout.md, "Old names")."""

import sys
import warnings

from mcsd.commands import generate as _renamed

if __name__ == "__main__":  # python -m mcsd.generate: the command, after one line on stderr
    print("mcsd.generate is renamed mcsd.commands.generate: run python -m mcsd.commands.generate (the old name goes in mcsd 0.2.0)",
          file=sys.stderr)
    _renamed.main()
else:
    warnings.warn("mcsd.generate is renamed mcsd.commands.generate: import that instead (the old name goes in mcsd 0.2.0)",
                  DeprecationWarning, stacklevel=2)
    sys.modules[__name__] = _renamed
