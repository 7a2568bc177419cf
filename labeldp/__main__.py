import sys

from labeldp.cli import main

sys.exit(main())
