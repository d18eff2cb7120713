import sys

from jaxrl_frag.app.cli import main

sys.exit(main())
