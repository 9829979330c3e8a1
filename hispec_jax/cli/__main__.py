"""`python -m hispec_jax.cli ARGS` is `hispec ARGS`."""

import sys

from hispec_jax.cli import main

if __name__ == "__main__":
    sys.exit(main())
