"""`python -m preheat_server` is `preheat-server`."""

import sys

from preheat_server.cli import main

sys.exit(main())
