"""`python -m kvpilot.runtime.engine_core`: the engine-core process (see process.py)."""

import sys

from kvpilot.runtime.engine_core.process import main

if __name__ == "__main__":
    sys.exit(main())
