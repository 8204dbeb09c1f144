import sys

from shaperd.cli.main import main

sys.exit(main())
