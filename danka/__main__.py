import sys

from danka.cli import main

sys.exit(main())
