"""python -m rcswarm.worker: the same as `rcswarm worker`."""

import sys

from rcswarm.worker.worker import main

sys.exit(main())
