"""`python -m sparseditto.cli`: the same as the `sparseditto` console script."""
import sys

from sparseditto.cli.app import main

sys.exit(main())
