"""python -m rcswarm.coordinator: the same as `rcswarm coordinator`."""

import sys

from rcswarm.coordinator.server import main

sys.exit(main())
