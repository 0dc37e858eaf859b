"""`python -m rcswarm.cli` is the `rcswarm` command."""

import sys

from rcswarm.cli.main import main

sys.exit(main())
