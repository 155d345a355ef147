"""Renamed :mod:`mcsd.commands.prepare`. This name still imports (the same module) and runs
(``python -m mcsd.prepare``), with a deprecation line, until mcsd 0.2.0 (docs/layout.md, "Old names")."""

import sys
import warnings

from mcsd.commands import prepare as _renamed

if __name__ == "__main__":  # python -m mcsd.prepare: the command, after one line on stderr
    print("mcsd.prepare is renamed mcsd.commands.prepare: run python -m mcsd.commands.prepare (the old name goes in mcsd 0.2.0)",
          file=sys.stderr)
    _renamed.main()
else:
    warnings.warn("mcsd.prepare is renamed mcsd.commands.prepare: import that instead (the old name goes in mcsd 0.2.0)",
                  DeprecationWarning, stacklevel=2)
    sys.modules[__name__] = _renamed
