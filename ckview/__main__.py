import sys

from ckview.cli.main import main

sys.exit(main())
