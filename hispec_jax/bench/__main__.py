"""`python -m hispec_jax.bench TOOL [args]`: runs one benchmark tool (`bench/tools.py`);
without a TOOL it lists them."""

import sys

from hispec_jax.bench.tools import main

if __name__ == "__main__":
    sys.exit(main())
