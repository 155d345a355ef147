"""Renamed :mod:`mcsd.commands.evaluate`. This name still imports (the same module) and runs
(``python -m mcsd.evaluation.run``), with a deprecation line, until mcsd 0.2.0 (docs/layout.md, "Old names")."""

import sys
import warnings

from mcsd.commands import evaluate as _renamed

if __name__ == "__main__":  # python -m mcsd.evaluation.run: the command, after one line on stderr
    print("mcsd.evaluation.run is renamed mcsd.commands.evaluate: run python -m mcsd.commands.evaluate (the old name goes in mcsd 0.2.0)",
          file=sys.stderr)
    _renamed.main()
else:
    warnings.warn("mcsd.evaluation.run is renamed mcsd.commands.evaluate: import that instead (the old name goes in mcsd 0.2.0)",
                  DeprecationWarning, stacklevel=2)
    sys.modules[__name__] = _renamed
