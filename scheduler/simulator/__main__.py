import sys

from scheduler.simulator.cli import main

sys.exit(main())
