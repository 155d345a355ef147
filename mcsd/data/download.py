"""Renamed :mod:`mcsd.commands.download`. This name still imports (the same module) and runs
(``python -m mcsd.data.download``), with a deprecation line, until mcsd 0.2.0 (docs/layout.md, "Old names")."""

import sys
import warnings

from mcsd.commands import download as _renamed

if __name__ == "__main__":  # python -m mcsd.data.download: the command, after one line on stderr
    print("mcsd.data.download is renamed mcsd.commands.download: run python -m mcsd.commands.download (the old name goes in mcsd 0.2.0)",
          file=sys.stderr)
    _renamed.main()
else:
    warnings.warn("mcsd.data.download is renamed mcsd.commands.download: import that instead (the old name goes in mcsd 0.2.0)",
                  DeprecationWarning, stacklevel=2)
    sys.modules[__name__] = _renamed
