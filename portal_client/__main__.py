import sys

from portal_client.cli import main

sys.exit(main())
